//! [`Reload`]: the preset's settings changed while the stack runs, from a [`BackstopConfig`]
//! given to [`Reload::apply`] or read again from a file by [`Reload::watch_file`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::config::BackstopConfig;
use super::{BackstopLayer, client_rule, policies};
use crate::breaker::{BreakerLayer, Builder};
use crate::observe::{Event, Hook};
use crate::retry::{PolicyCell, RetryPolicy};
use crate::settings::{ConfigError, join};

/// A handle that changes the settings of a running [`BackstopLayer`] and of every service it
/// built: the retry policy (attempts, backoff, delays, deadline, budget, hedging, per-class
/// rules) and the breakers' thresholds, rates, open durations, probes, adaptive send rate,
/// adaptive concurrency limit and per-host bound. Take it with [`BackstopLayer::reloadable`]; clones share one stack.
///
/// A change is checked whole before anything changes ([`apply`](Self::apply)): a
/// configuration that does not build, or that changes a setting a running stack cannot take,
/// is refused with a [`ConfigError`] naming the field, and the stack keeps its settings.
///
/// What a reload changes, and what it keeps:
///
/// - **Retry**: a call takes the policy in force when it starts, and keeps it to its end
///   (attempts, delays, deadline); calls that start after the reload take the new one. A
///   retry budget whose settings did not change is kept with its tokens; a changed one starts
///   full.
/// - **Breakers**: every breaker, per host ones included, keeps its state: an open breaker
///   stays open until the end of the period it opened for (a new open duration applies from
///   its next opening), a closed one keeps its window's counts and its failures in a row, a
///   half-open one its probes. The new thresholds judge the next outcome recorded, of a call
///   in flight too. The adaptive send rate keeps its current rate; its new settings act from
///   the next throttled answer. The adaptive concurrency limit keeps its current limit and
///   queue; its new settings act from its next change. A lower `max_keys` evicts idle breakers as new hosts come.
/// - **Refused while running** (build a new stack to change them): `attempt_timeout`, and
///   what a breaker's window is built for: turning a rate rule or the slow-call rule on or
///   off, the window's kind or size (`breaker.count_window`, `breaker.time_window`),
///   `breaker.failure_classes`, turning `breaker.adaptive_rate` or
///   `breaker.adaptive_concurrency` on or off, `breaker.name`.
///
/// The configuration is applied over the preset's defaults, as
/// [`BackstopConfig::http`] and [`BackstopConfig::grpc`] apply it: a field left out of the
/// new configuration means the preset's default, not the value before.
///
/// Each applied reload emits [`Event::SettingsReloaded`] and an `INFO` line to `tracing`;
/// each refused one [`Event::SettingsRefused`] and a `WARN` line, with the field and the
/// problem (events go to the layer's [`listener`](BackstopLayer::listener)).
///
/// ```
/// use std::time::Duration;
/// use tower_backstop::config::BackstopConfig;
///
/// let config: BackstopConfig = toml::from_str(r#"attempt_timeout = "2s""#)?;
/// let (layer, reload) = config.http()?.reloadable();
/// # let _ = layer;
///
/// // Later, on call: fewer attempts, a breaker that trips sooner.
/// let mut tighter = config.clone();
/// tighter.retry.max_attempts = Some(2);
/// tighter.breaker.failure_rate = Some(0.25);
/// reload.apply(&tighter)?;
/// assert_eq!(reload.version(), 1);
///
/// // Refused, the field named, nothing changed.
/// let mut wrong = tighter.clone();
/// wrong.breaker.failure_rate = Some(1.5);
/// let err = reload.apply(&wrong).unwrap_err();
/// assert_eq!(err.path(), "breaker.failure_rate");
/// assert_eq!(reload.version(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Reload {
    inner: Arc<Inner>,
}

struct Inner {
    cell: Arc<PolicyCell>,
    breakers: Box<dyn Breakers>,
    grpc: bool,
    attempt_timeout: Duration,
    listener: Hook,
    /// Reloads one at a time, and what the last one applied.
    state: Mutex<Applied>,
}

struct Applied {
    version: u64,
    config: Option<BackstopConfig>,
    /// The retry policy in force, before the preset's per-stack bounds.
    policy: RetryPolicy,
}

/// The breakers of the stack, whatever their key.
trait Breakers: Send + Sync + 'static {
    fn is_keyed(&self) -> bool;
    fn cannot_take(&self, builder: &Builder) -> Option<&'static str>;
    fn retune(&self, builder: &Builder, max_keys: Option<usize>);
}

impl<K: Send + Sync + 'static> Breakers for BreakerLayer<K> {
    fn is_keyed(&self) -> bool {
        BreakerLayer::is_keyed(self)
    }

    fn cannot_take(&self, builder: &Builder) -> Option<&'static str> {
        BreakerLayer::cannot_take(self, builder)
    }

    fn retune(&self, builder: &Builder, max_keys: Option<usize>) {
        BreakerLayer::retune(self, builder, max_keys);
    }
}

impl<C, K: Send + Sync + 'static> BackstopLayer<C, BreakerLayer<K>> {
    /// This layer, made reloadable, and the [`Reload`] handle that changes its settings while
    /// the services it builds run (feature `serde`). Call it last, after every other option:
    /// [`retry`](Self::retry), [`breaker`](Self::breaker), [`listener`](Self::listener) and
    /// [`without_adaptive_rate`](Self::without_adaptive_rate) build the policy or the breakers
    /// afresh, and the layer they return is no longer reloadable (its handle no longer
    /// reaches it). [`dead_letters`](Self::dead_letters) may come after.
    ///
    /// A service built before this call is not reloadable; every service built by the layer
    /// it returns, and every clone of one, is. The cost on a call is one atomic load (has a
    /// reload come?) and, after a reload, one read lock per service to take the new policy.
    pub fn reloadable(mut self) -> (Self, Reload) {
        let policy = self.retry.policy.clone();
        let cell = PolicyCell::new(policies(&policy, self.attempt_timeout));
        self.reload = Some(cell.clone());
        let reload = Reload {
            inner: Arc::new(Inner {
                cell,
                breakers: Box::new(self.breaker.clone()),
                grpc: self.grpc,
                attempt_timeout: self.attempt_timeout,
                listener: self.listener.clone(),
                state: Mutex::new(Applied {
                    version: 0,
                    config: None,
                    policy,
                }),
            }),
        };
        (self, reload)
    }
}

impl Reload {
    /// Checks `config` whole, then applies it: the next calls retry by its policy, and the
    /// breakers decide by its thresholds (see [`Reload`] for what is kept).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the field, and nothing changed, when `config` does not build
    /// (the checks of [`BackstopConfig::http`] and [`BackstopConfig::grpc`]), or changes what
    /// a running stack cannot take (`attempt_timeout`, a breaker's window, counted classes,
    /// adaptive rate or concurrency limit on or off, name: see [`Reload`]).
    pub fn apply(&self, config: &BackstopConfig) -> Result<(), ConfigError> {
        self.apply_from(config, "handle")
    }

    /// The number of reloads applied since the stack was built (0: the settings it was built
    /// with). A refused reload does not count.
    pub fn version(&self) -> u64 {
        self.lock().version
    }

    /// The configuration of the last reload applied; `None` before the first.
    pub fn config(&self) -> Option<BackstopConfig> {
        self.lock().config.clone()
    }

    /// Reads `path` every `every` from a task on the current tokio runtime, and applies it
    /// each time its text changes: `parse` turns the text into a configuration (for TOML,
    /// `|text| toml::from_str(text)`; any serde format). A text that does not read (a file
    /// half-written, an unknown field: the parser's error, with its line when the parser
    /// gives one) or does not build (a value out of range) is refused as [`apply`](Self::apply)
    /// refuses, the stack keeping its settings, and the same text is not tried again; a later
    /// complete write is applied. A file that cannot be read (being replaced) is tried again
    /// at the next look. The first look is at once: a file that differs from the settings
    /// the stack was built with is applied then.
    ///
    /// The file is read with `std::fs` in the task (a configuration file is small). The task
    /// holds the handle; abort the returned [`JoinHandle`](tokio::task::JoinHandle) to stop
    /// it.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime, as [`tokio::spawn`].
    pub fn watch_file<F, E>(
        &self,
        path: impl AsRef<Path>,
        every: Duration,
        parse: F,
    ) -> tokio::task::JoinHandle<()>
    where
        F: Fn(&str) -> Result<BackstopConfig, E> + Send + 'static,
        E: fmt::Display,
    {
        let path = path.as_ref().to_path_buf();
        let reload = self.clone();
        tokio::spawn(async move {
            let mut last: Option<String> = None;
            let mut unreadable = false;
            loop {
                reload.look(&path, &parse, &mut last, &mut unreadable);
                tokio::time::sleep(every).await;
            }
        })
    }

    /// One look at the watched file.
    fn look<F, E>(
        &self,
        path: &PathBuf,
        parse: &F,
        last: &mut Option<String>,
        unreadable: &mut bool,
    ) where
        F: Fn(&str) -> Result<BackstopConfig, E>,
        E: fmt::Display,
    {
        let source = path.display().to_string();
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) => {
                if !*unreadable {
                    tracing::warn!(source, error = %e, "settings file not read; settings kept");
                    *unreadable = true;
                }
                return;
            }
        };
        *unreadable = false;
        if last.as_deref() == Some(text.as_str()) {
            return;
        }
        let config = match parse(&text) {
            Ok(config) => Some(config),
            Err(e) => {
                self.refused(&source, "", &e.to_string());
                None
            }
        };
        if let Some(config) = config {
            // Refused or applied, each reported by `apply_from`.
            let _ = self.apply_from(&config, &source);
        }
        *last = Some(text);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Applied> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `config`, from `source` (a file's path, or `handle`), reporting either way.
    fn apply_from(&self, config: &BackstopConfig, source: &str) -> Result<(), ConfigError> {
        let mut applied = self.lock();
        match self.check(config, &applied.policy) {
            Ok((policy, breaker, max_keys)) => {
                let inner = &self.inner;
                inner.breakers.retune(&breaker, max_keys);
                inner.cell.set(policies(&policy, inner.attempt_timeout));
                applied.version += 1;
                applied.config = Some(config.clone());
                applied.policy = policy;
                let version = applied.version;
                drop(applied);
                tracing::info!(source, version, "settings reloaded");
                inner
                    .listener
                    .emit_ref(&Event::SettingsReloaded { source, version });
                Ok(())
            }
            Err(e) => {
                drop(applied);
                self.refused(source, e.path(), e.problem());
                Err(e)
            }
        }
    }

    fn refused(&self, source: &str, field: &str, problem: &str) {
        tracing::warn!(
            source,
            field,
            problem,
            "settings reload refused; settings kept"
        );
        self.inner.listener.emit_ref(&Event::SettingsRefused {
            source,
            field,
            problem,
        });
    }

    /// The retry policy and the breaker rule of `config`, checked, with the budget of
    /// `current` kept when its settings did not change.
    #[allow(clippy::type_complexity)]
    fn check(
        &self,
        config: &BackstopConfig,
        current: &RetryPolicy,
    ) -> Result<(RetryPolicy, Builder, Option<usize>), ConfigError> {
        let inner = &self.inner;
        if config.attempt_timeout != inner.attempt_timeout {
            return Err(ConfigError::new(
                "attempt_timeout",
                format!(
                    "cannot change while the stack runs (it is {:?}); build a new stack to change it",
                    inner.attempt_timeout
                ),
            ));
        }
        let base = if inner.grpc {
            RetryPolicy::grpc()
        } else {
            RetryPolicy::new()
        };
        let mut policy = config
            .retry
            .apply_at("retry", base, &[])?
            .build()
            .map_err(|e| ConfigError::from_build("retry", &e))?
            .policy
            .with_attempt_bound(inner.attempt_timeout);
        if inner.listener.is_set() {
            policy = policy.with_hook(&inner.listener);
        }
        if let (Some(new), Some(old)) = (policy.budget_ref(), current.budget_ref())
            && new.same_settings(old)
        {
            let kept = old.clone();
            policy = policy.budget(kept);
        }
        let (breaker, max_keys) = if inner.breakers.is_keyed() {
            let keyed = config
                .breaker
                .per_key_at("breaker", client_rule().per_host(), &[])?;
            let max_keys = keyed.keys.max_keys;
            (keyed.without_keys(), Some(max_keys))
        } else {
            (
                config.breaker.single_at("breaker", client_rule(), &[])?,
                None,
            )
        };
        if let Some(field) = inner.breakers.cannot_take(&breaker) {
            return Err(ConfigError::new(
                join("breaker", field),
                "cannot change while the stack runs (the breakers' windows and counts are built \
                 for it); build a new stack to change it",
            ));
        }
        Ok((policy, breaker, max_keys))
    }
}

impl fmt::Debug for Reload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let applied = self.lock();
        f.debug_struct("Reload")
            .field("version", &applied.version)
            .field("config", &applied.config)
            .finish_non_exhaustive()
    }
}
