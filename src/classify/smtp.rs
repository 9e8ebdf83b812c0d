//! The SMTP classifier: reply codes (RFC 5321 §4.2) to classes.

use std::sync::Arc;

use super::{Classifier, Verdict};
use crate::failure::{Class, Code};

/// The SMTP classifier: maps a reply code to a [`Class`], keeping it as [`Code::Smtp`].
///
/// | reply | class |
/// |---|---|
/// | 2xx, 3xx | success |
/// | 421 (service not available, closing channel) | [`Class::THROTTLED`] |
/// | 450, 451, 452 and any other 4xx (transient negative completion, RFC 5321 §4.2.1) | [`Class::TRANSIENT`] |
/// | 550, 553 and any other 5xx (permanent negative completion) | [`Class::PERMANENT`] |
/// | anything else | [`Class::UNKNOWN`] |
///
/// [`map_reply`](Self::map_reply) overrides it reply by reply: for example 452 "mailbox full"
/// as a user `soft_bounce` class retried after 15 min, 1 h, 6 h, or 550 as
/// `invalid_recipient`.
///
/// It classifies a service that answers the reply code itself (a `u16`); for your mail client's
/// own response type, a closure hands it the code ([`classify_reply`](Self::classify_reply)):
///
/// ```
/// use tower_backstop::classify::{ClassifyLayer, SmtpClassifier};
///
/// struct Reply {
///     code: u16,
///     text: String,
/// }
///
/// let smtp = SmtpClassifier::new();
/// let _layer = ClassifyLayer::new(move |reply: &Reply| smtp.classify_reply(reply.code));
/// # let reply = Reply { code: 421, text: "try later".into() };
/// # assert_eq!(
/// #     SmtpClassifier::new().classify_reply(reply.code).map(|v| v.class),
/// #     Some(tower_backstop::Class::THROTTLED)
/// # );
/// # let _ = reply.text;
/// ```
#[derive(Clone, Debug, Default)]
pub struct SmtpClassifier {
    overrides: Option<Arc<Vec<(u16, Class)>>>,
}

impl SmtpClassifier {
    /// The default mapping.
    pub fn new() -> Self {
        SmtpClassifier::default()
    }

    /// Classifies reply `code` as `class`.
    pub fn map_reply(mut self, code: u16, class: Class) -> Self {
        let overrides = Arc::make_mut(self.overrides.get_or_insert_with(Default::default));
        overrides.retain(|(c, _)| *c != code);
        overrides.push((code, class));
        self
    }

    /// The class of reply `code`: `None` for success.
    pub fn class_of(&self, code: u16) -> Option<Class> {
        if let Some(overrides) = &self.overrides
            && let Some((_, class)) = overrides.iter().find(|(c, _)| *c == code)
        {
            return Some(*class);
        }
        match code {
            200..=399 => None,
            421 => Some(Class::THROTTLED),
            400..=499 => Some(Class::TRANSIENT),
            500..=599 => Some(Class::PERMANENT),
            _ => Some(Class::UNKNOWN),
        }
    }
}

impl SmtpClassifier {
    /// The verdict on reply `code`, keeping it as [`Code::Smtp`]: `None` for success.
    pub fn classify_reply(&self, code: u16) -> Option<Verdict> {
        Some(Verdict::new(self.class_of(code)?, Code::Smtp(code)))
    }
}

impl Classifier<u16> for SmtpClassifier {
    fn classify_response(&self, code: &u16) -> Option<Verdict> {
        self.classify_reply(*code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_map_to_classes_and_keep_their_code() {
        const SOFT_BOUNCE: Class = Class::new("soft_bounce");
        const INVALID_RECIPIENT: Class = Class::new("invalid_recipient");
        let c = SmtpClassifier::new()
            .map_reply(452, SOFT_BOUNCE)
            .map_reply(550, INVALID_RECIPIENT);
        for (code, class) in [
            (250, None),
            (354, None),
            (421, Some(Class::THROTTLED)),
            (450, Some(Class::TRANSIENT)),
            (451, Some(Class::TRANSIENT)),
            (452, Some(SOFT_BOUNCE)),
            (550, Some(INVALID_RECIPIENT)),
            (553, Some(Class::PERMANENT)),
            (999, Some(Class::UNKNOWN)),
        ] {
            let v = c.classify_response(&code);
            assert_eq!(v, c.classify_reply(code), "{code}");
            assert_eq!(v.map(|v| v.class), class, "{code}");
            if let Some(v) = v {
                assert_eq!(v.code, Code::Smtp(code));
            }
        }
        assert_eq!(SmtpClassifier::new().class_of(452), Some(Class::TRANSIENT));
    }
}
