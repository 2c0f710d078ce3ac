//! The Secrets a pass reads when the table needs them, by name and never cached whole:
//! the state (under a state-read permit) with its inputs Secret, attempt variables and
//! errored states, and the Secrets and ConfigMaps the spec references.

use super::*;

/// The state of `o` and what is read beside it: the state, the inputs and the lock at once, then what
/// the inputs (or, without them, the spec) reference, at once; as `wanted` says, without
/// the inputs and what they reference ([`gather::inputs_with_state`]). These are read
/// live: the decision acts on them. With `caches`, the lock is taken from the cache of
/// Terraform's locks once it has listed ([`Caches::lock`]), and the errored states are
/// found in the cache of the object's Secrets' metadata, except shortly after a Job of
/// the object failed ([`gather::failed_lately`]); before a first apply
/// ([`StateWanted::FirstApply`]), a state and an inputs Secret the caches show no Secret
/// of are taken as absent, and what the spec references is what `o` holds; at the record
/// of an apply's end ([`StateWanted::Record`]), an inputs Secret the caches show none of
/// and the caller kept none of. What the caller kept ([`Kept`]) is used instead of a read.
pub(crate) async fn read_secrets(
    client: &Client,
    caches: Option<&Caches>,
    o: &Observed,
    (state_reads, lane): (&StateReads, Lane),
    (wanted, kept): (StateWanted, Kept<'_>),
) -> Result<StateRead, Error> {
    // Waits its turn: at most as many states in memory as there are permits.
    let permit = state_reads.acquire(lane).await;
    let ns = o.meta.namespace.clone().unwrap_or_default();
    let name = o.meta.name.clone().unwrap_or_default();
    tracing::debug!(kind = o.kind.as_str(), %name, "reading the state, the inputs and the lock");
    let suffix = names::state_suffix(o.kind, &name);
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    let leases = Api::<Lease>::namespaced(client.clone(), &ns);
    let state_name = names::state_secret_name(&suffix);
    let lock_name = names::lock_lease_name(&suffix);
    let absent = wanted == StateWanted::FirstApply
        && caches.is_some_and(|c| c.shows_no_state_nor_inputs(&ns, &suffix));
    let inputs = wanted.inputs();
    let kept_inputs = kept
        .inputs
        .filter(|_| matches!(wanted, StateWanted::Preview | StateWanted::Record));
    let inputs_absent = wanted == StateWanted::Record
        && kept_inputs.is_none()
        && caches.is_some_and(|c| {
            c.secret_meta(&ns, &names::inputs_secret_name(&suffix))
                .is_none()
        });
    let ((state, state_meta), inputs_read, lock, errored) = futures::try_join!(
        async {
            match (
                absent,
                kept.state.filter(|_| wanted == StateWanted::Preview),
            ) {
                (true, _) => Ok((state::StateSecrets::from_secrets(&state_name, &[]), None)),
                (false, Some(kept)) => Ok((kept.clone(), kept.metas.get(&state_name).cloned())),
                (false, None) => {
                    chunked::read_with_meta(&secrets, &state_name, Some(&suffix)).await
                }
            }
        },
        async {
            match (absent, inputs) {
                (true, _) => Ok((
                    None,
                    (
                        o.referenced_secrets.clone(),
                        o.referenced_config_maps.clone(),
                    ),
                )),
                (false, true) => match (kept_inputs, inputs_absent) {
                    (Some(kept), _) => Ok((
                        Some(kept.clone()),
                        read_referenced(client, o, Some(kept)).await?,
                    )),
                    (None, true) => Ok((None, read_referenced(client, o, None).await?)),
                    (None, false) => read_inputs(client, o).await,
                },
                (false, false) => Ok(Default::default()),
            }
        },
        lock_of(caches, &leases, &lock_name),
        read_errored(
            &secrets,
            caches.filter(|_| !gather::failed_lately(o)),
            o.kind,
            &name,
        ),
    )?;
    let (inputs_secret, (referenced_secrets, referenced_config_maps)) = inputs_read;
    // An apply attempt whose end is to be recorded: the inputs it ran, which become the
    // destroy's if it wrote the state.
    let attempt_secret = match gather::apply::unrecorded_apply(o) {
        Some(u) => {
            let job = names::job_name(&suffix, names::OPERATION_APPLY, u.attempt);
            match kept
                .attempt
                .filter(|s| s.metadata.name.as_deref() == Some(&job))
            {
                Some(s) => Some(s.clone()),
                None => secrets.get_opt(&job).await?,
            }
        }
        None => None,
    };
    Ok(StateRead {
        inputs_read: inputs,
        permit: Some(permit),
        state,
        errored,
        state_meta,
        inputs_secret,
        attempt_secret,
        referenced_secrets,
        referenced_config_maps,
        lock,
    })
}

/// What the caller of [`read_secrets`] kept of the object's Secrets, at the versions its
/// caches show: used instead of a read.
#[derive(Clone, Copy, Default)]
pub struct Kept<'a> {
    /// The inputs Secret, for a preview or a record ([`StateWanted::Preview`],
    /// [`StateWanted::Record`]) only: what starts an attempt reads it live.
    pub inputs: Option<&'a Secret>,
    /// The variables Secret of the apply attempt whose end is to be recorded, as the
    /// manager wrote it when it started the attempt.
    pub attempt: Option<&'a Secret>,
    /// The state, for a preview ([`StateWanted::Preview`]) only, as the record of an
    /// apply's end read it.
    pub state: Option<&'a state::StateSecrets>,
}

/// Terraform's lock Lease `name` in `leases`' namespace: from the cache of locks once it
/// has listed ([`Caches::lock`]), else read.
pub(crate) async fn lock_of(
    caches: Option<&Caches>,
    leases: &Api<Lease>,
    name: &str,
) -> Result<Option<Lease>, Error> {
    let ns = leases.namespace().unwrap_or_default();
    match caches.and_then(|c| c.lock(ns, name)) {
        Some(cached) => Ok(cached),
        None => Ok(leases.get_opt(name).await?),
    }
}

/// The inputs Secret of `o`, then what it (or, without it, the spec) references.
pub async fn read_inputs(
    client: &Client,
    o: &Observed,
) -> Result<
    (
        Option<Secret>,
        (BTreeMap<String, Secret>, BTreeMap<String, ConfigMap>),
    ),
    Error,
> {
    let ns = o.meta.namespace.clone().unwrap_or_default();
    let suffix = names::state_suffix(o.kind, o.meta.name.as_deref().unwrap_or_default());
    let inputs = Api::<Secret>::namespaced(client.clone(), &ns)
        .get_opt(&names::inputs_secret_name(&suffix))
        .await?;
    let referenced = read_referenced(client, o, inputs.as_ref()).await?;
    Ok((inputs, referenced))
}

/// The Secrets and ConfigMaps the inputs (or, without them, the spec) reference, read at
/// once; those that do not exist are left out.
pub async fn read_referenced(
    client: &Client,
    o: &Observed,
    inputs_secret: Option<&Secret>,
) -> Result<(BTreeMap<String, Secret>, BTreeMap<String, ConfigMap>), Error> {
    let ns = o.meta.namespace.clone().unwrap_or_default();
    let suffix = names::state_suffix(o.kind, o.meta.name.as_deref().unwrap_or_default());
    let mut secret_names: Vec<String> = o
        .spec
        .env
        .iter()
        .map(|e| e.secret_key_ref.name.clone())
        .collect();
    let mut config_maps = Vec::new();
    for v in &o.spec.variables_from {
        match v.kind {
            VariablesSourceKind::Secret => secret_names.push(v.name.clone()),
            VariablesSourceKind::ConfigMap => config_maps.push(v.name.clone()),
        }
    }
    if let Some(Ok(i)) = inputs_secret.map(|s| inputs::from_secret(s, &ns, &suffix)) {
        secret_names.extend(i.env.iter().map(|e| e.secret_key_ref.name.clone()));
    }
    secret_names.sort();
    secret_names.dedup();
    config_maps.sort();
    config_maps.dedup();
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    let cms = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let (found_secrets, found_maps) = futures::try_join!(
        futures::future::try_join_all(secret_names.into_iter().map(|s| {
            let secrets = &secrets;
            async move { Ok::<_, Error>(secrets.get_opt(&s).await?.map(|v| (s, v))) }
        })),
        futures::future::try_join_all(config_maps.into_iter().map(|c| {
            let cms = &cms;
            async move { Ok::<_, Error>(cms.get_opt(&c).await?.map(|v| (c, v))) }
        })),
    )?;
    Ok((
        found_secrets.into_iter().flatten().collect(),
        found_maps.into_iter().flatten().collect(),
    ))
}

/// The errored states a runner kept for the object (see [`state::Errored`]): the metadata
/// of the Secrets of every object of its kind and name (by the owner labels, whatever the
/// uid: after `clusterctl move` or a recreate, the errored states of the earlier uid are
/// this object's too), then, only when there are any, the errored ones in full.
async fn read_errored(
    secrets: &Api<Secret>,
    caches: Option<&Caches>,
    kind: Kind,
    name: &str,
) -> Result<Vec<state::Errored>, Error> {
    let suffix = names::state_suffix(kind, name);
    let legacy = names::errored_secret_name(&suffix);
    let ns = secrets.namespace().unwrap_or_default().to_string();
    let metas: Vec<kube::core::PartialObjectMeta<Secret>> = match caches {
        Some(c) => caches::namesakes(&c.secrets, &c.secrets_by_owner, kind, &ns, name),
        None => {
            let lp = ListParams::default().labels(&namesake_selector(kind, name));
            secrets.list_metadata(&lp).await?.items
        }
    };
    let errored: Vec<String> = metas
        .into_iter()
        .filter(|m| {
            m.metadata.name.as_deref() == Some(legacy.as_str())
                || m.labels()
                    .get(names::TF_LABEL_SUFFIX)
                    .is_some_and(|e| names::is_errored_suffix_of(e, &suffix))
        })
        .filter_map(|m| m.metadata.name)
        .collect();
    let found = futures::future::try_join_all(
        errored
            .iter()
            .map(|name| async move { Ok::<_, Error>(secrets.get_opt(name).await?) }),
    )
    .await?;
    let found: Vec<Secret> = found.into_iter().flatten().collect();
    Ok(state::Errored::find(&suffix, &found))
}
