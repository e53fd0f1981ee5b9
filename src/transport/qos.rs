//! `input_qos: auto`: subscribe with what the publishers offer, by the rule `ros2 bag
//! record` uses (rosbag2's `Rosbag2QoS::adapt_request_to_offers`): reliable only if
//! every publisher offers reliable, else best effort (a reliable subscription would not
//! match a best-effort publisher); transient-local only if every publisher offers it,
//! else volatile. Like rosbag2, the node subscribes once the topic has a publisher
//! ([`NO_PUBLISHER_YET`] until then): a best-effort subscription made earlier (to match
//! whatever appears) would take a reliable camera's first frames without repairing
//! them. It keeps a subscription when the publishers leave, and evaluates the rule
//! again whenever they change.

use std::fmt;

/// Reliability offered by a publisher or requested by a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reliability {
    /// Lost samples are resent (fragments of large samples are repaired).
    Reliable,
    /// Lost samples stay lost.
    BestEffort,
}

/// Durability offered or requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Only samples published after the match.
    Volatile,
    /// Late subscribers get the publisher's history.
    TransientLocal,
}

/// What one publisher offers (anything the middleware reports other than reliable or
/// transient-local counts as best effort / volatile, which match everything).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offer {
    /// Its reliability.
    pub reliability: Reliability,
    /// Its durability.
    pub durability: Durability,
}

/// The subscription QoS the rule chose, with the publishers it was chosen for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Adapted {
    /// Requested reliability.
    pub reliability: Reliability,
    /// Requested durability.
    pub durability: Durability,
    /// Publishers seen.
    pub publishers: usize,
    /// Of them, offering reliable.
    pub reliable: usize,
    /// Of them, offering transient-local.
    pub transient_local: usize,
}

impl Adapted {
    /// True when a subscription made for `self` must be recreated for `other`.
    pub(crate) fn differs(&self, other: &Adapted) -> bool {
        (self.reliability, self.durability) != (other.reliability, other.durability)
    }

    /// "reliable, volatile" (what is requested).
    pub(crate) fn policies(&self) -> String {
        let r = match self.reliability {
            Reliability::Reliable => "reliable",
            Reliability::BestEffort => "best effort",
        };
        let d = match self.durability {
            Durability::Volatile => "volatile",
            Durability::TransientLocal => "transient local",
        };
        format!("{r}, {d}")
    }
}

impl fmt::Display for Adapted {
    /// What was chosen and why, for the log and `/diagnostics`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.publishers;
        write!(f, "{}: ", self.policies())?;
        if n == 0 {
            return write!(f, "{NO_PUBLISHER_YET}");
        }
        let reliability = match (self.reliable, self.reliability) {
            (r, Reliability::Reliable) if r == n => {
                format!("{} offer{} reliable", all(n), plural(n))
            }
            (0, _) => format!("{} offer{} best effort", all(n), plural(n)),
            (r, _) => format!(
                "{} of {n} publishers offer{} best effort (a reliable subscription would not \
                 match {}; frames from the reliable ones are not repaired)",
                n - r,
                plural(n - r),
                if n - r == 1 { "it" } else { "them" }
            ),
        };
        let durability = match (self.transient_local, self.durability) {
            (t, Durability::TransientLocal) if t == n => "transient local".to_string(),
            (0, _) => "volatile".to_string(),
            (t, _) => format!("volatile, {t} of {n} transient local"),
        };
        write!(f, "{reliability}; {durability}")
    }
}

fn all(n: usize) -> String {
    if n == 1 {
        "the publisher".to_string()
    } else {
        format!("all {n} publishers")
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        "s"
    } else {
        ""
    }
}

/// What `auto` says before the topic has a publisher (no subscription yet).
pub(crate) const NO_PUBLISHER_YET: &str =
    "no publisher yet (subscribes with what the first one offers, within 0.25 s)";

/// The rule (see the module documentation); `None` without publishers.
pub(crate) fn adapt_to_offers(offers: &[Offer]) -> Option<Adapted> {
    let n = offers.len();
    if n == 0 {
        return None;
    }
    let reliable = offers.iter().filter(|o| o.reliability == Reliability::Reliable).count();
    let transient_local =
        offers.iter().filter(|o| o.durability == Durability::TransientLocal).count();
    Some(Adapted {
        reliability: if reliable == n { Reliability::Reliable } else { Reliability::BestEffort },
        durability: if transient_local == n {
            Durability::TransientLocal
        } else {
            Durability::Volatile
        },
        publishers: n,
        reliable,
        transient_local,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const RELIABLE: Offer =
        Offer { reliability: Reliability::Reliable, durability: Durability::Volatile };
    const BEST_EFFORT: Offer =
        Offer { reliability: Reliability::BestEffort, durability: Durability::Volatile };
    const LATCHED: Offer =
        Offer { reliability: Reliability::Reliable, durability: Durability::TransientLocal };

    #[test]
    fn reliable_only_when_every_publisher_offers_it() {
        let a = adapt_to_offers(&[RELIABLE, RELIABLE]).unwrap();
        assert_eq!((a.reliability, a.durability), (Reliability::Reliable, Durability::Volatile));
        assert_eq!(a.to_string(), "reliable, volatile: all 2 publishers offer reliable; volatile");
        let b = adapt_to_offers(&[RELIABLE, BEST_EFFORT]).unwrap();
        assert_eq!(b.reliability, Reliability::BestEffort);
        assert!(a.differs(&b));
        assert_eq!(
            b.to_string(),
            "best effort, volatile: 1 of 2 publishers offers best effort (a reliable \
             subscription would not match it; frames from the reliable ones are not \
             repaired); volatile"
        );
        let c = adapt_to_offers(&[BEST_EFFORT]).unwrap();
        assert_eq!(
            c.to_string(),
            "best effort, volatile: the publisher offers best effort; volatile"
        );
        assert!(!b.differs(&c));
    }

    #[test]
    fn transient_local_only_when_every_publisher_offers_it() {
        let a = adapt_to_offers(&[LATCHED]).unwrap();
        assert_eq!(
            (a.reliability, a.durability),
            (Reliability::Reliable, Durability::TransientLocal)
        );
        let b = adapt_to_offers(&[LATCHED, RELIABLE]).unwrap();
        assert_eq!((b.reliability, b.durability), (Reliability::Reliable, Durability::Volatile));
        assert!(b.to_string().ends_with("volatile, 1 of 2 transient local"), "{b}");
    }

    #[test]
    fn no_publisher_no_answer() {
        assert_eq!(adapt_to_offers(&[]), None);
        let be = adapt_to_offers(&[BEST_EFFORT]).unwrap();
        assert!(be.differs(&adapt_to_offers(&[RELIABLE]).unwrap()));
        assert!(!be.differs(&adapt_to_offers(&[BEST_EFFORT, BEST_EFFORT]).unwrap()));
    }
}
