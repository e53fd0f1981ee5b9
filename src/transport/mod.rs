//! The message path's decisions, without ROS types (the node applies them with r2r):
//! the keep-latest hand-over of formed frame sets ([`Latest`]), the input QoS chosen from
//! what publishers offer (`adapt_to_offers`), frames lost before they reach the node
//! (`DeliveryMonitor`) the node's own Fast DDS transports (`dds`), and which frame of each camera goes into
//! a batch ([`batch_sync`]; one camera is a batch of one).

pub mod batch_sync;
#[cfg(feature = "ros")]
pub(crate) mod dds;
pub mod delivery;
pub(crate) mod latest;
pub(crate) mod qos;

pub(crate) use delivery::{Basis, Delivery, DeliveryMonitor, Timeliness};
pub use latest::Latest;
pub(crate) use qos::{adapt_to_offers, Adapted, Durability, Offer, Reliability, NO_PUBLISHER_YET};
