//! What the caches keep of each object: only the fields a pass reads, so that the
//! manager's memory follows the number of objects, not their size.

use super::*;

pub(super) fn trim_meta<T>(m: &mut PartialObjectMeta<T>) {
    m.metadata.managed_fields = None;
}

/// What a TerraformCluster reads of its machines and pools: their names, labels and
/// owners (the Cluster they belong to).
pub fn trim_to_owners<T>(m: &mut PartialObjectMeta<T>) {
    m.metadata.managed_fields = None;
    m.metadata.annotations = None;
    m.metadata.finalizers = None;
}

/// What the facts read of a Job: its metadata, status, `suspend`, and the containers'
/// names and resources (an OOM-killed runner's message names its memory limit).
pub fn trim_job(job: &mut Job) {
    job.metadata.managed_fields = None;
    if let Some(spec) = job.spec.as_mut() {
        spec.selector = None;
        let t = &mut spec.template;
        t.metadata = None;
        if let Some(p) = t.spec.as_mut() {
            p.volumes = None;
            p.init_containers = None;
            p.affinity = None;
            p.tolerations = None;
            p.containers.iter_mut().for_each(keep_name_and_resources);
        }
    }
}

/// What the facts read of a Pod: its metadata, status, node, and containers' names.
pub fn trim_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    if let Some(p) = pod.spec.as_mut() {
        p.volumes = None;
        p.affinity = None;
        p.tolerations = None;
        p.containers
            .iter_mut()
            .chain(p.init_containers.iter_mut().flatten())
            .for_each(keep_name_and_resources);
    }
}

/// A container as the facts read it: its name and resources.
fn keep_name_and_resources(c: &mut k8s_openapi::api::core::v1::Container) {
    *c = k8s_openapi::api::core::v1::Container {
        name: std::mem::take(&mut c.name),
        resources: c.resources.take(),
        ..Default::default()
    };
}

/// The Event's bulk the refusals do not read.
pub fn trim_event(e: &mut CoreEvent) {
    e.metadata.managed_fields = None;
}
