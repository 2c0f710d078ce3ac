//! Leader election on a coordination.k8s.io Lease, so that two replicas are safe, as
//! client-go's leaderelection does it: the holder renews it, and steps down when it has
//! not managed to for the renew deadline; another replica takes over once it has seen the
//! same record, unchanged, for the lease duration on its own clock. A leader that stops
//! gives the Lease up ([`Leadership::release`], client-go's `ReleaseOnCancel`), so that
//! another replica takes over at its next try rather than a lease duration later. Writes
//! are guarded by the Lease's resourceVersion.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{info, warn};

pub struct LeaderConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    /// How long a Lease record must stay unchanged, as this replica sees it, before it may
    /// take the Lease over.
    pub lease_duration: Duration,
    /// How long the leader keeps leading without a successful renewal; shorter than the
    /// lease duration, so that it has stopped before another replica may take over.
    pub renew_deadline: Duration,
    /// How often the Lease is tried or renewed.
    pub renew_every: Duration,
}

/// What a replica saw of the Lease: its record as written, and when (on this replica's
/// own monotonic clock) it first saw that record. Expiry is judged by how long the record
/// has stayed the same here, never by comparing the holder's `renewTime` with the local
/// wall clock, so a clock that is off on either side cannot take a healthy leader's Lease
/// (client-go's rule).
#[derive(Default)]
pub struct Elector {
    observed: Option<(Record, Instant)>,
}

/// The fields of a Lease that change when its holder renews it or another takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    holder: String,
    renew_time: Option<Timestamp>,
    acquire_time: Option<Timestamp>,
    transitions: i32,
    duration: i32,
}

impl Record {
    fn of(spec: &LeaseSpec) -> Record {
        Record {
            holder: spec.holder_identity.clone().unwrap_or_default(),
            renew_time: spec.renew_time.as_ref().map(|t| t.0),
            acquire_time: spec.acquire_time.as_ref().map(|t| t.0),
            transitions: spec.lease_transitions.unwrap_or(0),
            duration: spec.lease_duration_seconds.unwrap_or(0),
        }
    }
}

impl Elector {
    pub fn new() -> Elector {
        Elector::default()
    }

    /// Tries once to take or renew the Lease; returns whether this replica holds it.
    pub async fn try_acquire(
        &mut self,
        api: &Api<Lease>,
        cfg: &LeaderConfig,
    ) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let seen_at = Instant::now();
        let secs = i32::try_from(cfg.lease_duration.as_secs())
            .unwrap_or(15)
            .max(1);
        match api.get_opt(&cfg.name).await? {
            None => {
                let spec = LeaseSpec {
                    holder_identity: Some(cfg.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                };
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(cfg.name.clone()),
                        namespace: Some(cfg.namespace.clone()),
                        ..Default::default()
                    },
                    spec: Some(spec.clone()),
                };
                match api.create(&PostParams::default(), &lease).await {
                    Ok(_) => {
                        self.observed = Some((Record::of(&spec), seen_at));
                        Ok(true)
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(e),
                }
            }
            Some(mut lease) => {
                let spec = lease.spec.clone().unwrap_or_default();
                let record = Record::of(&spec);
                let since = match &self.observed {
                    Some((r, at)) if *r == record => *at,
                    _ => {
                        self.observed = Some((record.clone(), seen_at));
                        seen_at
                    }
                };
                let duration = Duration::from_secs(
                    u64::try_from(spec.lease_duration_seconds.unwrap_or(secs)).unwrap_or(15),
                );
                let expired = seen_at.duration_since(since) > duration;
                let holder = record.holder.clone();
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
                lease.spec = Some(new_spec.clone());
                match api.replace(&cfg.name, &PostParams::default(), &lease).await {
                    Ok(_) => {
                        self.observed = Some((Record::of(&new_spec), seen_at));
                        Ok(true)
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Gives the Lease up if this replica holds it, as client-go's `release` writes it: no
    /// holder, a lease duration of one second, renewed now (the transitions kept). Any
    /// replica takes a Lease without a holder at its next try. Returns whether this replica
    /// released it (false: another holds it, or it is gone).
    pub async fn release(
        &mut self,
        api: &Api<Lease>,
        cfg: &LeaderConfig,
    ) -> Result<bool, kube::Error> {
        // A conflict is a write between the read and ours: read again once.
        for _ in 0..2 {
            let Some(mut lease) = api.get_opt(&cfg.name).await? else {
                return Ok(false);
            };
            let spec = lease.spec.clone().unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(cfg.identity.as_str()) {
                return Ok(false);
            }
            let now = MicroTime(Timestamp::now());
            lease.spec = Some(LeaseSpec {
                holder_identity: None,
                lease_duration_seconds: Some(1),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..spec
            });
            match api.replace(&cfg.name, &PostParams::default(), &lease).await {
                Ok(_) => {
                    self.observed = None;
                    return Ok(true);
                }
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }
}

/// The leadership of a replica that won the Lease: renewed in the background until it is
/// lost or given up.
pub struct Leadership {
    /// `true` while this replica leads; turns `false` when leadership is lost (another
    /// replica holds the Lease, or no renewal succeeded for the renew deadline).
    pub held: watch::Receiver<bool>,
    give_up: oneshot::Sender<()>,
    renewing: JoinHandle<()>,
}

impl Leadership {
    /// Stops renewing (after a renewal under way, which is bounded by the renew deadline)
    /// and releases the Lease if this replica still holds it. Call it once nothing guarded
    /// by the Lease runs any more.
    pub async fn release(self) {
        if self.give_up.send(()).is_err() {
            // The renewals ended already: leadership was lost, nothing to give up.
            return;
        }
        let _ = self.renewing.await;
    }
}

/// Waits until this replica leads, then keeps renewing in the background ([`Leadership`]).
/// `None` when `stop` resolved first (the manager stops before it led). A lost leadership
/// makes the manager exit, so that it restarts clean instead of acting on a Lease it may
/// no longer hold.
pub async fn lead(
    client: Client,
    cfg: LeaderConfig,
    stop: impl std::future::Future<Output = ()>,
) -> Option<Leadership> {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut elector = Elector::new();
    tokio::pin!(stop);
    loop {
        // A try is never cut halfway: a Lease created or taken by a try dropped in flight
        // would be held without this replica knowing.
        match elector.try_acquire(&api, &cfg).await {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => warn!(error = %e, "leader election: cannot read or write the Lease"),
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.renew_every) => {}
            _ = &mut stop => return None,
        }
    }
    info!(identity = %cfg.identity, lease = %cfg.name, "became the leader");
    let (tx, held) = watch::channel(true);
    let (give_up, mut given_up) = oneshot::channel::<()>();
    let renewing = tokio::spawn(async move {
        let mut last_ok = Instant::now();
        loop {
            tokio::select! {
                biased;
                asked = &mut given_up => {
                    // Asked (not dropped): give the Lease up, within the renew deadline.
                    if asked.is_ok() {
                        let released = tokio::time::timeout(
                            cfg.renew_deadline,
                            elector.release(&api, &cfg),
                        )
                        .await;
                        match released {
                            Ok(Ok(true)) => info!(lease = %cfg.name, "leader election: released the Lease"),
                            Ok(Ok(false)) => info!(lease = %cfg.name, "leader election: the Lease is not this replica's any more"),
                            Ok(Err(e)) => warn!(error = %e, "leader election: cannot release the Lease; it expires after its duration"),
                            Err(_) => warn!("leader election: releasing the Lease did not answer in time; it expires after its duration"),
                        }
                    }
                    return;
                }
                _ = tokio::time::sleep(cfg.renew_every) => {}
            }
            let tried = tokio::time::timeout(
                cfg.renew_deadline.saturating_sub(last_ok.elapsed()),
                elector.try_acquire(&api, &cfg),
            )
            .await;
            match tried {
                Ok(Ok(true)) => last_ok = Instant::now(),
                Ok(Ok(false)) => {
                    warn!("leader election: another replica holds the Lease");
                    let _ = tx.send(false);
                    return;
                }
                Ok(Err(e)) => warn!(error = %e, "leader election: renewing failed"),
                Err(_) => warn!("leader election: renewing did not answer in time"),
            }
            if last_ok.elapsed() >= cfg.renew_deadline {
                warn!(
                    deadline = ?cfg.renew_deadline,
                    "leader election: no renewal within the renew deadline; stepping down"
                );
                let _ = tx.send(false);
                return;
            }
        }
    });
    Some(Leadership {
        held,
        give_up,
        renewing,
    })
}
