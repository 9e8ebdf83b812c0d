//! What `examples/throttled.rs` and `examples/throttle_sweep` share: the message every stack
//! is given, the load of callers sending one message after another, and the three kinds of
//! stack measured against a throttling provider (tower's `Retry`, tower-resilience's adaptive
//! limiter in front of its retry, the backstop preset), each as a
//! `Service<Message, Response = (), Error = Failed>`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tower::{Service, ServiceBuilder, ServiceExt};
use tower_backstop::BackstopLayer;
use tower_backstop::retry::Attempts;

pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// Each attempt's bound, in every stack.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// What every stack is given: one message, the key the provider counts its deliveries by. Every
/// stack answers `Ok(())` when the provider took the message (a 2xx), or why it did not.
#[derive(Clone, Debug)]
pub struct Message {
    pub key: String,
}

/// Why a call failed, in a stack's own words.
#[derive(Debug)]
pub struct Failed(pub String);

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Failed {}

/// The load's shape.
pub struct Load {
    pub callers: usize,
    pub duration: Duration,
    /// The start of the run left out of [`ClientCounts::succeeded_steady`].
    pub warm_up: Duration,
}

/// What the callers saw.
#[derive(Debug, Default)]
pub struct ClientCounts {
    pub succeeded: u64,
    /// Successful calls answered after the warm-up and before the load's end (the steady part
    /// of the run).
    pub succeeded_steady: u64,
    pub failed: u64,
    pub reasons: HashMap<String, u64>,
    /// Each successful call's time, from the stack's `ready` to its answer; sorted.
    pub latencies: Vec<Duration>,
    /// From the first call to the last answer (the load's duration plus the calls in hand).
    pub elapsed: Duration,
}

/// `load.callers` tasks, each sending one message after another through a clone of `svc` until
/// `load.duration` has passed, then finishing its message in hand.
pub async fn run<S>(svc: S, load: &Load) -> ClientCounts
where
    S: Service<Message, Response = (), Error = Failed> + Clone + Send + 'static,
    S::Future: Send,
{
    let started = Instant::now();
    let duration = load.duration;
    let warm_up = load.warm_up;
    let end = started + duration;
    let mut tasks = Vec::with_capacity(load.callers);
    for caller in 0..load.callers {
        let mut svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            let mut counts = ClientCounts::default();
            let mut seq = 0u64;
            while Instant::now() < end {
                seq += 1;
                let message = Message {
                    key: format!("c{caller}-m{seq}"),
                };
                let sent = Instant::now();
                let result = match svc.ready().await {
                    Ok(ready) => ready.call(message).await,
                    Err(reason) => Err(reason),
                };
                match result {
                    Ok(()) => {
                        counts.succeeded += 1;
                        let answered = started.elapsed();
                        counts.succeeded_steady +=
                            u64::from(answered >= warm_up && answered < duration);
                        counts.latencies.push(sent.elapsed());
                    }
                    Err(Failed(reason)) => {
                        counts.failed += 1;
                        *counts.reasons.entry(reason).or_default() += 1;
                        // A stack that fails at once would otherwise keep this worker thread
                        // to itself.
                        tokio::task::yield_now().await;
                    }
                }
            }
            counts
        }));
    }
    let mut all = ClientCounts::default();
    for task in tasks {
        let counts = task.await.expect("a caller panicked");
        all.succeeded += counts.succeeded;
        all.succeeded_steady += counts.succeeded_steady;
        all.failed += counts.failed;
        for (reason, n) in counts.reasons {
            *all.reasons.entry(reason).or_default() += n;
        }
        all.latencies.extend(counts.latencies);
    }
    all.elapsed = started.elapsed();
    all.latencies.sort_unstable();
    all
}

impl ClientCounts {
    /// The `q`-quantile of the successful calls' latencies.
    pub fn latency(&self, q: f64) -> Option<Duration> {
        let sorted = &self.latencies;
        if sorted.is_empty() {
            return None;
        }
        let rank = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len());
        Some(sorted[rank - 1])
    }
}

/// The stacks, each turned into a `Service<Message, Response = (), Error = Failed>` so that
/// one load function drives them all.
pub mod stacks {
    use super::*;
    use tower_backstop::Failure;

    /// A reqwest request for `message`: a POST with the message's `Idempotency-Key`.
    fn request(client: &reqwest::Client, url: &reqwest::Url, message: Message) -> reqwest::Request {
        client
            .post(url.clone())
            .header("idempotency-key", message.key)
            .body(r#"{"to":"a@example.com"}"#)
            .build()
            .expect("a POST to a parsed URL builds")
    }

    /// The client as a `Service<Message>`: one attempt, reqwest's own answer.
    fn send(
        client: reqwest::Client,
        url: reqwest::Url,
    ) -> impl Service<Message, Response = reqwest::Response, Error = reqwest::Error, Future: Send>
    + Clone
    + Send
    + 'static {
        tower::service_fn(move |message: Message| client.execute(request(&client, &url, message)))
    }

    /// A 2xx is a delivery; any other status is a failed call named by its status.
    fn delivered(response: &reqwest::Response) -> Result<(), Failed> {
        if response.status().is_success() {
            Ok(())
        } else {
            Err(Failed(format!("status {}", response.status().as_u16())))
        }
    }

    // Each stack's error as a `Failed` (`MapResult` needs `From` for readiness errors too).
    impl From<tower::BoxError> for Failed {
        fn from(error: tower::BoxError) -> Self {
            Failed(error.to_string())
        }
    }

    impl From<tower_resilience_adaptive::AdaptiveError<AttemptError>> for Failed {
        fn from(error: tower_resilience_adaptive::AdaptiveError<AttemptError>) -> Self {
            match error {
                tower_resilience_adaptive::AdaptiveError::Service(error) => {
                    Failed(error.to_string())
                }
                error => Failed(error.to_string()),
            }
        }
    }

    /// A failure's class and code, and why the retry layer stopped:
    /// `throttled (http 429): attempts exhausted`.
    impl From<Failure<reqwest::Response>> for Failed {
        fn from(failure: Failure<reqwest::Response>) -> Self {
            Failed(match failure.note::<Attempts>() {
                Some(attempts) => format!(
                    "{} ({}): {}",
                    failure.class(),
                    failure.code(),
                    attempts.give_up()
                ),
                None => format!("{} ({})", failure.class(), failure.code()),
            })
        }
    }

    /// tower's `Retry` (a 429 retried after its `Retry-After`, 3 attempts in all) over tower's
    /// `Timeout`.
    pub fn tower_retry(
        client: reqwest::Client,
        url: reqwest::Url,
    ) -> impl Service<Message, Response = (), Error = Failed, Future: Send> + Clone + Send + 'static
    {
        ServiceBuilder::new()
            .map_result(
                |result: Result<reqwest::Response, tower::BoxError>| match result {
                    Ok(response) => delivered(&response),
                    Err(error) => Err(Failed::from(error)),
                },
            )
            .layer(tower::retry::RetryLayer::new(RetryAfter { attempts: 3 }))
            .timeout(ATTEMPT_TIMEOUT)
            .service(send(client, url))
    }

    /// tower's retry policy for the `tower Retry` stack: a 429 is retried after the seconds of
    /// its `Retry-After` (1 s when it has none) while attempts are left; nothing else is.
    #[derive(Clone, Debug)]
    struct RetryAfter {
        /// Attempts left, the one in flight included.
        attempts: u32,
    }

    impl tower::retry::Policy<Message, reqwest::Response, tower::BoxError> for RetryAfter {
        type Future = tokio::time::Sleep;

        fn retry(
            &mut self,
            _: &mut Message,
            result: &mut Result<reqwest::Response, tower::BoxError>,
        ) -> Option<Self::Future> {
            let response = result.as_ref().ok()?;
            if response.status() != reqwest::StatusCode::TOO_MANY_REQUESTS || self.attempts <= 1 {
                return None;
            }
            self.attempts -= 1;
            let seconds = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1);
            Some(tokio::time::sleep(Duration::from_secs(seconds)))
        }

        fn clone_request(&mut self, message: &Message) -> Option<Message> {
            Some(message.clone())
        }
    }

    /// What one attempt of the `tower-resilience adaptive` stack can end in: its limiter and its
    /// retry read a failure from the error side only, so a 429 is made an error.
    #[derive(Debug)]
    enum AttemptError {
        Throttled,
        Status(u16),
        Timeout,
        Transport(reqwest::Error),
    }

    impl std::fmt::Display for AttemptError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                AttemptError::Throttled => f.write_str("status 429"),
                AttemptError::Status(status) => write!(f, "status {status}"),
                AttemptError::Timeout => f.write_str("attempt timed out"),
                AttemptError::Transport(error) => write!(f, "{error}"),
            }
        }
    }

    /// tower-resilience's AIMD limiter (its README's settings, at most `callers` in flight) in
    /// front of its retry (3 attempts, 1 s apart, on a 429 only), as its docs stack them.
    pub fn adaptive(
        client: reqwest::Client,
        url: reqwest::Url,
        callers: usize,
    ) -> Result<
        impl Service<Message, Response = (), Error = Failed, Future: Send> + Clone + Send + 'static,
        Error,
    > {
        use tower_resilience_adaptive::{AdaptiveError, AdaptiveLimiterLayer, Aimd};
        let aimd = Aimd::builder()
            .initial_limit(10)
            .min_limit(1)
            .max_limit(callers)
            .increase_by(1)
            .decrease_factor(0.5)
            .latency_threshold(Duration::from_millis(100))
            .build()?;
        let retry = tower_resilience_retry::RetryLayer::<Message, reqwest::Response, AttemptError>::builder()
            .max_attempts(3)
            .fixed_backoff(Duration::from_secs(1))
            .retry_on(|error| matches!(error, AttemptError::Throttled))
            .build();
        let send = send(client, url);
        let attempt = tower::service_fn(move |message: Message| {
            let call = send.clone().oneshot(message);
            async move {
                match tokio::time::timeout(ATTEMPT_TIMEOUT, call).await {
                    Err(_) => Err(AttemptError::Timeout),
                    Ok(Err(error)) => Err(AttemptError::Transport(error)),
                    Ok(Ok(response)) if response.status() == 429 => Err(AttemptError::Throttled),
                    Ok(Ok(response)) if !response.status().is_success() => {
                        Err(AttemptError::Status(response.status().as_u16()))
                    }
                    Ok(Ok(response)) => Ok(response),
                }
            }
        });
        Ok(ServiceBuilder::new()
            .map_result(
                |result: Result<reqwest::Response, AdaptiveError<AttemptError>>| {
                    result.map(drop).map_err(Failed::from)
                },
            )
            .layer(AdaptiveLimiterLayer::new(aimd))
            .layer(retry)
            .service(attempt))
    }

    /// The README's preset around the reqwest client, `layer` as given (no store).
    pub fn backstop(
        client: reqwest::Client,
        url: reqwest::Url,
        layer: BackstopLayer,
    ) -> impl Service<Message, Response = (), Error = Failed, Future: Send> + Clone + Send + 'static
    {
        let requests = client.clone();
        ServiceBuilder::new()
            .map_result(
                |result: Result<reqwest::Response, Failure<reqwest::Response>>| match result {
                    Ok(response) => delivered(&response),
                    Err(failure) => Err(Failed::from(failure)),
                },
            )
            .map_request(move |message: Message| request(&requests, &url, message))
            .layer(layer)
            .service(client)
    }
}
