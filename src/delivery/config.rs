//! `[delivery]` of the daemon's configuration: raw keys (unknown ones refused) and their
//! validation (no I/O). systemd/hsiedge.toml documents every key.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::source::check_scene_id;

/// `[delivery]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDelivery {
    /// This node's name in messages and MQTT topics.
    pub node: Option<String>,
    /// Entries the queue holds before intake pauses.
    pub queue_max: Option<usize>,
    /// Seconds a subscriber has to acknowledge a segment before it is sent again.
    pub ack_timeout_s: Option<f64>,
    /// TCP address (`IP:PORT`) CBOR subscribers connect to.
    pub subscriber_tcp: Option<String>,
    /// Unix socket path CBOR subscribers connect to.
    pub subscriber_unix: Option<PathBuf>,
    /// MiB the outbox's file system must have free before a worker takes a scene (0: no check).
    pub outbox_min_free_mib: Option<u64>,
    /// `[delivery.mqtt]`.
    pub mqtt: Option<RawMqtt>,
}

/// `[delivery.mqtt]` as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMqtt {
    /// `HOST:PORT` of the broker.
    pub broker: String,
    /// The MQTT client id (default `hsiedge-<node>`).
    pub client_id: Option<String>,
    /// Seconds between keep-alive pings.
    pub keep_alive_s: Option<u64>,
    /// Seconds between reconnection attempts.
    pub retry_s: Option<f64>,
}

/// Defaults of the keys left out.
pub mod defaults {
    /// `delivery.node`.
    pub const NODE: &str = "hsiedge";
    /// `delivery.queue_max`.
    pub const QUEUE_MAX: usize = 256;
    /// `delivery.ack_timeout_s`.
    pub const ACK_TIMEOUT_S: f64 = 10.0;
    /// `delivery.mqtt.keep_alive_s`.
    pub const KEEP_ALIVE_S: u64 = 5;
    /// `delivery.mqtt.retry_s`.
    pub const RETRY_S: f64 = 1.0;
}

/// Where CBOR subscribers connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscriberAddr {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A Unix socket path.
    Unix(PathBuf),
}

/// `[delivery.mqtt]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct MqttConfig {
    /// Broker host.
    pub host: String,
    /// Broker port.
    pub port: u16,
    /// Client id.
    pub client_id: String,
    /// Keep-alive interval.
    pub keep_alive: Duration,
    /// Wait between reconnection attempts.
    pub retry: Duration,
}

/// `[delivery]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryConfig {
    /// This node's name.
    pub node: String,
    /// The queue's bound in entries.
    pub queue_max: usize,
    /// How long a subscriber has to acknowledge.
    pub ack_timeout: Duration,
    /// The CBOR subscriber socket, if any.
    pub subscriber: Option<SubscriberAddr>,
    /// The MQTT sink, if any.
    pub mqtt: Option<MqttConfig>,
    /// Bytes the outbox's file system must have free before a worker takes a scene (0: no check).
    pub outbox_min_free: u64,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        Self {
            node: defaults::NODE.into(),
            queue_max: defaults::QUEUE_MAX,
            ack_timeout: Duration::from_secs_f64(defaults::ACK_TIMEOUT_S),
            subscriber: None,
            mqtt: None,
            outbox_min_free: 0,
        }
    }
}

impl RawDelivery {
    /// Checks every value; relative paths are joined to `base`. An error is the dotted key and
    /// what is wrong with it.
    pub fn validate(self, base: &std::path::Path) -> Result<DeliveryConfig, (String, String)> {
        let bad = |k: &str, m: String| (format!("delivery.{k}"), m);
        let node = self.node.unwrap_or_else(|| defaults::NODE.into());
        // The node names an MQTT topic level: the scene-id alphabet keeps `/`, `+`, `#` out.
        check_scene_id(&node).map_err(|e| bad("node", e.to_string()))?;
        let queue_max = match self.queue_max {
            Some(0) => return Err(bad("queue_max", "must be at least 1".into())),
            q => q.unwrap_or(defaults::QUEUE_MAX),
        };
        let ack = self.ack_timeout_s.unwrap_or(defaults::ACK_TIMEOUT_S);
        if !ack.is_finite() || !(0.01..=86_400.0).contains(&ack) {
            return Err(bad("ack_timeout_s", format!("{ack} is outside 0.01 ..= 86400 seconds")));
        }
        let subscriber = match (self.subscriber_tcp, self.subscriber_unix) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "subscriber_unix",
                    "give subscriber_tcp or subscriber_unix, not both".into(),
                ));
            }
            (Some(a), None) => Some(SubscriberAddr::Tcp(a.parse().map_err(|_| {
                bad("subscriber_tcp", format!("`{a}` is not IP:PORT (e.g. 127.0.0.1:5556)"))
            })?)),
            (None, Some(p)) if p.as_os_str().is_empty() => {
                return Err(bad("subscriber_unix", "is empty".into()));
            }
            (None, Some(p)) => Some(SubscriberAddr::Unix(if p.is_absolute() { p } else { base.join(p) })),
            (None, None) => None,
        };
        let mqtt = match self.mqtt {
            None => None,
            Some(m) => {
                let (host, port) = m
                    .broker
                    .rsplit_once(':')
                    .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
                    .filter(|(h, p)| !h.is_empty() && *p > 0)
                    .ok_or_else(|| bad("mqtt.broker", format!("`{}` is not HOST:PORT", m.broker)))?;
                let keep = m.keep_alive_s.unwrap_or(defaults::KEEP_ALIVE_S);
                if !(1..=3600).contains(&keep) {
                    return Err(bad("mqtt.keep_alive_s", format!("{keep} is outside 1 ..= 3600")));
                }
                let retry = m.retry_s.unwrap_or(defaults::RETRY_S);
                if !retry.is_finite() || !(0.01..=3600.0).contains(&retry) {
                    return Err(bad("mqtt.retry_s", format!("{retry} is outside 0.01 ..= 3600 seconds")));
                }
                let client_id = m.client_id.unwrap_or_else(|| format!("hsiedge-{node}"));
                if client_id.is_empty() || client_id.len() > 128 {
                    return Err(bad("mqtt.client_id", "must be 1 to 128 bytes".into()));
                }
                Some(MqttConfig {
                    host,
                    port,
                    client_id,
                    keep_alive: Duration::from_secs(keep),
                    retry: Duration::from_secs_f64(retry),
                })
            }
        };
        let min_free = self.outbox_min_free_mib.unwrap_or(0);
        if min_free > 1 << 30 {
            return Err(bad(
                "outbox_min_free_mib",
                format!("{min_free} MiB is more than a disk"),
            ));
        }
        Ok(DeliveryConfig {
            outbox_min_free: min_free << 20,
            node,
            queue_max,
            ack_timeout: Duration::from_secs_f64(ack),
            subscriber,
            mqtt,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<DeliveryConfig, (String, String)> {
        toml::from_str::<RawDelivery>(text)
            .unwrap()
            .validate(std::path::Path::new("/etc/h"))
    }

    #[test]
    fn keys_are_validated_and_each_error_names_its_key() {
        let c =
            parse("node = \"edge-1\"\nsubscriber_unix = \"sub.sock\"\n[mqtt]\nbroker = \"localhost:1883\"\n").unwrap();
        assert_eq!(c.subscriber, Some(SubscriberAddr::Unix("/etc/h/sub.sock".into())));
        let m = c.mqtt.unwrap();
        assert_eq!(
            (m.host.as_str(), m.port, m.client_id.as_str()),
            ("localhost", 1883, "hsiedge-edge-1")
        );
        assert_eq!(c.queue_max, defaults::QUEUE_MAX);
        for (text, key) in [
            ("node = \"a/b\"", "delivery.node"),
            ("queue_max = 0", "delivery.queue_max"),
            ("ack_timeout_s = -1.0", "delivery.ack_timeout_s"),
            ("subscriber_tcp = \"nope\"", "delivery.subscriber_tcp"),
            (
                "subscriber_tcp = \"127.0.0.1:1\"\nsubscriber_unix = \"/s\"",
                "delivery.subscriber_unix",
            ),
            ("[mqtt]\nbroker = \"host\"", "delivery.mqtt.broker"),
            (
                "[mqtt]\nbroker = \"h:1\"\nkeep_alive_s = 0",
                "delivery.mqtt.keep_alive_s",
            ),
        ] {
            let (k, msg) = parse(text).unwrap_err();
            assert_eq!(k, key, "{text}: {msg}");
        }
        assert!(toml::from_str::<RawDelivery>("bogus = 1").is_err());
    }
}
