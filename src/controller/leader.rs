//! Leader election on a coordination.k8s.io Lease, so that two replicas are safe: the
//! holder renews it; another replica takes over once it has not been renewed for the
//! lease duration. Writes are guarded by the Lease's resourceVersion.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;
use tracing::{info, warn};

pub struct LeaderConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_every: Duration,
}

/// Tries once to take or renew the Lease; returns whether this replica holds it.
pub async fn try_acquire(api: &Api<Lease>, cfg: &LeaderConfig) -> Result<bool, kube::Error> {
    let now = Timestamp::now();
    let secs = i32::try_from(cfg.lease_duration.as_secs()).unwrap_or(15);
    match api.get_opt(&cfg.name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(cfg.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        Some(mut lease) => {
            let spec = lease.spec.clone().unwrap_or_default();
            let holder = spec.holder_identity.clone().unwrap_or_default();
            let renewed = spec
                .renew_time
                .as_ref()
                .map(|t| t.0)
                .unwrap_or(Timestamp::UNIX_EPOCH);
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(secs));
            let expired = now.as_second() - renewed.as_second() > duration;
            if holder != cfg.identity && !holder.is_empty() && !expired {
                return Ok(false);
            }
            let mut new_spec = spec.clone();
            if holder != cfg.identity {
                new_spec.acquire_time = Some(MicroTime(now));
                new_spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            new_spec.holder_identity = Some(cfg.identity.clone());
            new_spec.renew_time = Some(MicroTime(now));
            new_spec.lease_duration_seconds = Some(secs);
            lease.spec = Some(new_spec);
            match api.replace(&cfg.name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

/// Waits until this replica leads, then keeps renewing in the background. The receiver
/// turns `false` when leadership is lost; the manager then exits so that it restarts
/// clean instead of acting on a Lease it no longer holds.
pub async fn lead(client: Client, cfg: LeaderConfig) -> watch::Receiver<bool> {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    loop {
        match try_acquire(&api, &cfg).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => warn!(error = %e, "leader election: cannot read or write the Lease"),
        }
        tokio::time::sleep(cfg.renew_every).await;
    }
    info!(identity = %cfg.identity, lease = %cfg.name, "became the leader");
    let (tx, rx) = watch::channel(true);
    tokio::spawn(async move {
        let mut last_ok = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(cfg.renew_every).await;
            match try_acquire(&api, &cfg).await {
                Ok(true) => last_ok = tokio::time::Instant::now(),
                Ok(false) => {
                    warn!("leader election: another replica holds the Lease");
                    let _ = tx.send(false);
                    return;
                }
                Err(e) => {
                    warn!(error = %e, "leader election: renewing failed");
                    if last_ok.elapsed() > cfg.lease_duration {
                        let _ = tx.send(false);
                        return;
                    }
                }
            }
        }
    });
    rx
}
