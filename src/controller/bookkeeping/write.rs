//! [`apply`]: carries out a pass's bookkeeping ([`super::plan`]) in the order the module's
//! head states: the Events, the pruning and the state's protection first, the object's
//! annotations last.

use std::collections::BTreeMap;

use super::*;

/// What the bookkeeping of a pass did.
pub struct Kept {
    /// The object was written: the next pass decides on fresh facts.
    pub written: bool,
    /// A state part was too new to protect (see [`PART_SETTLES`]).
    pub young_parts: bool,
    /// The state Secrets this pass protected: name → the resourceVersion its write made.
    pub protected: BTreeMap<String, String>,
}

/// Carries out `plan` in the order the file's head states.
pub async fn apply<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    o: &Observed,
    state_meta: &StateMeta,
    plan: Bookkeeping,
) -> Result<Kept, Error> {
    for note in &plan.notes {
        publish_note(ctx, obj, note).await;
    }
    if let Some(reason) = &plan.failure {
        ctx.metrics
            .destroy_failures
            .inc(&ByCause::new(K::KIND, reason));
    }
    if let Some(ran) = plan.failed_job_ran {
        let labels = ByJob {
            kind: KindValue(K::KIND),
            operation: names::OPERATION_DESTROY,
            outcome: "failed",
        };
        ctx.metrics.job_seconds.observe(&labels, ran);
    }
    if let Some(reason) = &plan.apply_failure {
        ctx.metrics
            .apply_failures
            .inc(&ByCause::new(K::KIND, reason));
    }
    if let Some((ran, outcome)) = plan.apply_job_ran {
        let labels = ByJob {
            kind: KindValue(K::KIND),
            operation: names::OPERATION_APPLY,
            outcome,
        };
        ctx.metrics.job_seconds.observe(&labels, ran);
    }
    let jobs: Api<Job> = scope.api_of();
    for name in &plan.prune {
        writes::delete_if_present(&jobs, name).await?;
        writes::delete_if_present(&scope.secrets, name).await?;
    }
    let (young_parts, protected) = match plan.protect {
        Protect::Nothing => (false, BTreeMap::new()),
        Protect::Base => protect_state(scope, obj, o, state_meta, false).await?,
        Protect::BaseAndParts => protect_state(scope, obj, o, state_meta, true).await?,
    };
    // A state of several Secrets just written (by an apply, ours or by hand): its parts
    // cannot have their protection finalizer yet, and a namespace deletion in the
    // meantime would take them. The backup, protected and whole, is made current first.
    let just_applied = plan.edits.iter().any(|(k, _)| *k == names::STATE_SERIAL);
    if young_parts || (just_applied && o.state.as_ref().is_some_and(|s| !s.parts.is_empty())) {
        backup_chunked(ctx, scope, obj, o).await?;
    }
    // The inputs of an apply that wrote the state become the destroy's before its end is
    // recorded on the object: a crash in between leaves the end unrecorded, and the next
    // pass finds these inputs promoted already.
    if let Some(p) = &plan.promote {
        promote_inputs(ctx, scope, obj, o, p).await?;
    }
    // The spec's fields with the annotations in one guarded write, then the status: a
    // reader never sees `provisioned` before the fields it goes with (a machine's
    // providerID), and a crash in between leaves a recorded success whose status the next
    // pass rebuilds from the state, as after a move.
    let mut edits: Vec<(&str, Option<String>)> = plan.edits;
    let spec_ops = match &plan.fields {
        Some(f) => {
            let n = edits
                .iter()
                .find(|(k, _)| *k == names::APPLIED_ATTEMPT)
                .and_then(|(_, v)| v.clone());
            let (ops, record) = spec_field_ops(ctx, obj, n.as_deref(), &f.spec).await;
            if let Some(record) = record {
                edits.push((names::OUTPUTS_REFUSED, record));
            }
            ops
        }
        None => Vec::new(),
    };
    let mut ops = annotation_ops(obj.meta(), &edits);
    ops.extend(spec_ops);
    let written = guarded_patch(&scope.api, obj.meta(), ops).await?;
    if let Some(f) = &plan.fields {
        let first = obj
            .status()
            .and_then(|s| s.initialization.as_ref())
            .and_then(|i| i.provisioned)
            != Some(true);
        let wrote =
            crate::controller::status::write_provisioned(&scope.api, obj, f.status.clone()).await?;
        if first && wrote {
            publish_note(
                ctx,
                obj,
                &Note::normal(
                    events::PROVISIONED,
                    "Apply",
                    "provisioned: status.initialization.provisioned is true".to_string(),
                ),
            )
            .await;
        }
    }
    Ok(Kept {
        written: written.is_some(),
        young_parts,
        protected,
    })
}

/// Makes the inputs of apply attempt `p.attempt` the destroy's: the inputs Secret is
/// written with them (created at the first apply that wrote a state), with what the
/// attempt ran when it succeeded (its image by digest, and what its runner reported in
/// the Pod's log: the lock file `init` wrote, the module's files fetched from a source
/// address), and `inputs-of-attempt` naming the attempt. The attempt's inputs are those
/// its own variables Secret carries; an attempt an older CAPTF started wrote them into the
/// inputs Secret before its Job, where they are taken when they hash as the object says.
/// The write is guarded by the inputs Secret as this pass read it: one changed since
/// fails the pass, and the next one decides again. A report that cannot be read is left
/// out, with a warning, and the destroy fetches what the inputs name; a log that cannot
/// be read for now (a kubelet restarting) fails the pass, and it is read again.
async fn promote_inputs<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    o: &Observed,
    p: &Promote,
) -> Result<(), Error> {
    let Some(inputs) = gather::apply::inputs_of_attempt(o, p.attempt) else {
        tracing::warn!(
            attempt = p.attempt,
            "the inputs of the apply that wrote the state cannot be read (its variables Secret is gone); the inputs Secret keeps those before it"
        );
        return Ok(());
    };
    let inputs = match &p.ran {
        Some(ran) => with_what_it_ran(ctx, scope, obj, inputs, ran).await?,
        None => inputs,
    };
    let mut secret = crate::inputs::inputs_secret(&inputs, &scope.identity());
    secret.metadata.annotations =
        Some([(names::INPUTS_OF_ATTEMPT.to_string(), p.attempt.to_string())].into());
    let name = names::inputs_secret_name(&scope.suffix);
    let written = match &o.inputs_secret {
        Some(current) => {
            // As read: a Secret changed since is not overwritten (409, and the pass fails).
            let mut updated = current.clone();
            updated.metadata.managed_fields = None;
            updated.data = secret.data;
            updated
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(names::INPUTS_OF_ATTEMPT.to_string(), p.attempt.to_string());
            scope
                .secrets
                .replace(&name, &kube::api::PostParams::default(), &updated)
                .await?
        }
        None => {
            scope
                .secrets
                .create(&kube::api::PostParams::default(), &secret)
                .await?
        }
    };
    // Kept as written: the passes after the record (its recorded values, the deletion's
    // preview) take it from memory, before the watch brings it too. The attempt's
    // variables, kept since its start, are not read again: forgotten.
    if scope.caches.is_some() {
        let replaced = o.inputs_secret.as_ref().and_then(|c| c.resource_version());
        ctx.kept_inputs
            .keep_written(&scope.uid, &written, replaced.as_deref());
        let attempt = names::job_name(&scope.suffix, names::OPERATION_APPLY, p.attempt);
        ctx.kept_inputs.forget_one(&scope.uid, &attempt);
    }
    let r = inputs.ran.as_ref();
    tracing::info!(
        attempt = p.attempt,
        digest = ?r.and_then(|r| r.image_digest.as_deref()),
        module_files = r.and_then(|r| r.module_files.as_ref()).map_or(0, |f| f.len()),
        lock_file = r.is_some_and(|r| r.lock_file.is_some()),
        "the inputs of the apply that wrote the state are the destroy's now"
    );
    Ok(())
}

/// `inputs` with what the successful apply ran, as its Pod reported it (see
/// [`promote_inputs`]); an empty record when even the digest would not fit, so that the
/// run is not read again.
async fn with_what_it_ran<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    inputs: crate::inputs::Inputs,
    ran: &gather::apply::ApplyRan,
) -> Result<crate::inputs::Inputs, Error> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = scope.api_of();
    let params = kube::api::LogParams {
        container: Some(crate::job::layout::CONTAINER_NAME.to_string()),
        tail_lines: Some(REPORT_TAIL_LINES),
        limit_bytes: Some(REPORT_LOG_MAX_BYTES),
        ..Default::default()
    };
    let reported = match pods.logs(&ran.pod, &params).await {
        Ok(log) => crate::job::report::parse(&log).unwrap_or_else(|why| {
            tracing::warn!(pod = %ran.pod, %why, "the apply's report of its run is not used");
            Default::default()
        }),
        // Gone with its Pod: nothing more to learn.
        Err(kube::Error::Api(e)) if e.code == 404 => Default::default(),
        // Not allowed (an installation whose ClusterRole lacks pods/log): the digest is
        // still recorded, and the destroy fetches the module as the inputs name it.
        Err(kube::Error::Api(e)) if e.code == 403 => {
            tracing::warn!(
                pod = %ran.pod,
                message = %e.message,
                "the apply's report of its run cannot be read: the manager's ClusterRole needs get on pods/log (config/rbac/role.yaml)"
            );
            Default::default()
        }
        Err(e) => return Err(e.into()),
    };
    let from_source = matches!(inputs.module, crate::inputs::Module::Source(_));
    let record = crate::inputs::Ran {
        image_digest: ran.image_digest.clone(),
        module_files: reported.module_files.filter(|_| from_source),
        lock_file: reported.lock_file.filter(|_| inputs.lock_file.is_none()),
        installed_modules: reported.installed_modules,
    };
    let renders = |i: &crate::inputs::Inputs| {
        crate::controller::act::attempt::render_operation(
            ctx,
            scope,
            obj,
            names::OPERATION_DESTROY,
            1,
            i,
        )
        .is_ok()
    };
    Ok(match crate::inputs::with_ran(&inputs, record, renders) {
        Some(i) => i,
        None => {
            let mut empty = inputs.clone();
            empty.ran = Some(Default::default());
            empty.version = empty.version.max(crate::inputs::INPUTS_VERSION);
            if empty.to_json_bytes().len() > crate::inputs::INPUTS_MAX_BYTES {
                inputs
            } else {
                empty
            }
        }
    })
}

/// Makes the backup a copy of the object's chunked state (see `act::backup`), as this
/// pass read it, or read now (with a state-read permit: this pass holds none then).
async fn backup_chunked<K: TerraformObject>(
    ctx: &Context,
    scope: &Scope<K>,
    obj: &K,
    o: &Observed,
) -> Result<(), Error> {
    let mut read = None;
    let _permit;
    let state = match &o.state {
        Some(s) => s,
        None => {
            _permit = ctx
                .state_reads
                .acquire(crate::state::permits::Lane::Ordinary)
                .await;
            let base = names::state_secret_name(&scope.suffix);
            read = Some(
                crate::state::secrets::read(&scope.secrets, &base, Some(&scope.suffix)).await?,
            );
            read.as_ref().expect("just read")
        }
    };
    if state.parts.is_empty() {
        return Ok(());
    }
    if let crate::state::StateContent::Parsed {
        lineage, serial, ..
    } = crate::state::read(state, ctx.settings.decompression_cap)
    {
        crate::controller::act::backup::ensure_backup(ctx, scope, obj, state, (&lineage, serial))
            .await?;
    }
    drop(read);
    Ok(())
}

/// How much of an apply Pod's log is read for its report: the report is at its end.
const REPORT_TAIL_LINES: i64 = 1000;

const REPORT_LOG_MAX_BYTES: i64 = 1024 * 1024;

/// A part Secret younger than this is not protected yet: Terraform makes a new part with
/// a create and then an update, and a finalizer added in between fails its write. (Only
/// a Terraform run outside CAPTF's Jobs can be writing when no Job runs.)
const PART_SETTLES: i64 = 10;

/// Puts the protection finalizer on the base state Secret and, with `parts`, on its part
/// Secrets and its errored states, so that a namespace deletion, which deletes every Secret in one call, leaves
/// the whole state. (While a Job runs they stay off the parts: Terraform deletes parts
/// itself when a state shrinks, and a part held in deletion would corrupt the next read;
/// the backup is the protected copy then.) Uses the metadata this pass read with the
/// state, or lists the base and parts by Terraform's suffix label. Returns whether a part
/// was left for being too new, and the versions its writes made (name → resourceVersion).
async fn protect_state<K: TerraformObject>(
    scope: &Scope<K>,
    obj: &K,
    o: &Observed,
    state_meta: &StateMeta,
    parts: bool,
) -> Result<(bool, BTreeMap<String, String>), Error> {
    let secrets: &Api<Secret> = &scope.secrets;
    let base = names::state_secret_name(&scope.suffix);
    let metas: Vec<ObjectMeta> = match (&o.state, state_meta) {
        (Some(state), Some(_)) => state.metas.values().cloned().collect(),
        _ => {
            let mut found = scope.labelled_state_metas().await?;
            // A base restored by hand may lack the label.
            if !found
                .iter()
                .any(|m| m.name.as_deref() == Some(base.as_str()))
                && obj
                    .meta()
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(names::APPLIED_AT))
                && let Some(m) = scope.secret_meta(&base).await?
            {
                found.push(m);
            }
            found
        }
    };
    // The errored states too (what Terraform could not save may be the only record of
    // what a failed run made), with the parts: never while a Job runs.
    let mut metas = metas;
    if parts {
        metas.extend(crate::controller::act::errored_metas(scope, o).await?);
    }
    let mut young = false;
    let mut written = BTreeMap::new();
    for meta in metas {
        let is_base = meta.name.as_deref() == Some(base.as_str());
        if meta.deletion_timestamp.is_some() || !(is_base || parts) {
            continue;
        }
        let ops = writes::add_finalizer_ops(&meta, names::PROTECT_FINALIZER);
        if ops.is_empty() {
            continue;
        }
        let age = meta
            .creation_timestamp
            .as_ref()
            .map(|t| o.now.as_second() - t.0.as_second());
        if !is_base && age.is_some_and(|a| a < PART_SETTLES) {
            young = true;
            continue;
        }
        match guarded_patch(secrets, &meta, ops).await {
            Ok(Some(s)) => {
                if let (Some(name), Some(v)) = (s.metadata.name, s.metadata.resource_version) {
                    written.insert(name, v);
                }
            }
            Ok(None) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok((young, written))
}

/// The JSON patch operations that set the outputs' spec fields on `obj`, and the edit of
/// `outputs-refused` the success of attempt `n` makes: a set-once field the outputs give
/// another value is kept, recorded (its condition says so) and announced by a Warning
/// Event; a success that refuses nothing removes an earlier record.
async fn spec_field_ops<K: TerraformObject>(
    ctx: &Context,
    obj: &K,
    n: Option<&str>,
    spec: &serde_json::Map<String, serde_json::Value>,
) -> (Vec<json_patch::PatchOperation>, Option<Option<String>>) {
    let current = serde_json::to_value(obj).unwrap_or_default();
    let (write, refused) = crate::contract::outputs::spec_changes(&current["spec"], spec);
    for (field, why) in &refused {
        let reason = match field.as_str() {
            "controlPlaneEndpoint" => events::CONTROL_PLANE_ENDPOINT_CHANGE_REFUSED,
            _ => events::PROVIDER_ID_CHANGE_REFUSED,
        };
        let note = format!("{why}; a new value needs a new object");
        publish_note(ctx, obj, &Note::warning(reason, "Apply", note)).await;
    }
    let record = if refused.is_empty() {
        obj.annotations()
            .contains_key(names::OUTPUTS_REFUSED)
            .then_some(None)
    } else {
        let whys: Vec<&str> = refused.iter().map(|(_, w)| w.as_str()).collect();
        Some(Some(format!(
            "{}: {}",
            n.unwrap_or("?"),
            job::cut(&whys.join("; "), 900)
        )))
    };
    let ops = write
        .into_iter()
        .map(|(field, value)| {
            json_patch::PatchOperation::Add(json_patch::AddOperation {
                path: json_patch::jsonptr::PointerBuf::from_tokens(["spec", field.as_str()]),
                value,
            })
        })
        .collect();
    (ops, record)
}
