#!/usr/bin/env python3
"""Regenerates the object dumps under examples/: one file per situation of the rule
table, as `kubectl get -o yaml` would show the objects. The state Secrets hold real
Terraform states, made by the real `terraform` binary with the built-in terraform_data
resource (no provider download). Run from the repository root:

    python3 examples/make-examples.py
"""
import base64, gzip, json, os, subprocess, sys, tempfile

import yaml  # PyYAML, only to write the dumps as kubectl does

TF = os.environ.get("TERRAFORM", "/usr/local/bin/terraform")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)))
A = "terraform.infrastructure.cluster.x-k8s.io"
NS = "team-a"  # replaced per scenario by write()


def terraform_states():
    """An applied state with 2 instances, then the same state after destroy."""
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "main.tf"), "w") as f:
        f.write('resource "terraform_data" "vm" {\n  count = 2\n  input = "web-1-${count.index}"\n}\n')
    env = dict(os.environ, TF_IN_AUTOMATION="1", HOME=d, TF_DATA_DIR=os.path.join(d, ".tfdata"), CHECKPOINT_DISABLE="1")
    run = lambda *a: subprocess.run([TF, *a], cwd=d, env=env, check=True, capture_output=True)
    run("init", "-input=false")
    run("apply", "-auto-approve", "-input=false")
    applied = open(os.path.join(d, "terraform.tfstate"), "rb").read()
    run("destroy", "-auto-approve", "-input=false")
    destroyed = open(os.path.join(d, "terraform.tfstate"), "rb").read()
    return applied, destroyed


def set_ns(ns):
    global NS
    NS = ns


def b64(data):
    return base64.b64encode(data).decode()


def state_secret(suffix, raw_json=None, gz=None):
    gz = gz if gz is not None else gzip.compress(raw_json, mtime=0)
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {
            "name": f"tfstate-default-{suffix}", "namespace": NS,
            "annotations": {"encoding": "gzip"},
            "labels": {"app.kubernetes.io/managed-by": "terraform", "tfstate": "true",
                       "tfstateSecretSuffix": suffix, "tfstateWorkspace": "default"},
            "creationTimestamp": "2026-11-30T09:00:00Z",
        },
        "data": {"tfstate": b64(gz)},
    }


def owner_labels(kind, name, uid):
    return {f"{A}/owner-kind": kind, f"{A}/owner-name": name, f"{A}/owner-uid": uid}


def inputs_secret(kind, name, uid, suffix, env=()):
    inputs = {"version": 1, "runner": {"image": "hashicorp/terraform:1.11.4"},
              "module": {"files": {"main.tf": 'variable "name" {}\nresource "terraform_data" "vm" {\n  count = 2\n  input = "${var.name}-${count.index}"\n}\n'}},
              "variables": {"name": name}, "env": list(env),
              "backend": {"namespace": NS, "secretSuffix": suffix}, "timeoutSeconds": 3600}
    labels = owner_labels(kind, name, uid)
    labels["clusterctl.cluster.x-k8s.io/move"] = ""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": f"captf-inputs-{suffix}", "namespace": NS, "labels": labels,
                         "finalizers": [f"{A}/protect"], "creationTimestamp": "2026-11-30T09:00:00Z"},
            "data": {"inputs.json": b64(json.dumps(inputs, sort_keys=True).encode())}}


def creds_secret():
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "cloud-creds", "namespace": NS},
            "data": {"token": b64(b"not-a-real-token")}}


def cluster(paused=False):
    c = {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
         "metadata": {"name": "prod", "namespace": NS, "uid": "3c0a0000-0000-4000-8000-000000000001"},
         "spec": {"infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "TerraformCluster", "name": "prod"}}}
    if paused:
        c["spec"]["paused"] = True
    return c


def obj(kind, name, uid, annotations=None, deleting=True, extra_labels=None):
    labels = {"cluster.x-k8s.io/cluster-name": "prod"}
    labels.update(extra_labels or {})
    short = {"TerraformCluster": "tfc", "TerraformMachine": "tfm", "TerraformMachinePool": "tfmp"}[kind]
    meta = {"name": name, "namespace": NS, "uid": uid, "generation": 1,
            "labels": labels, "annotations": annotations or {},
            "finalizers": [f"{kind.lower()}.infrastructure.cluster.x-k8s.io"],
            "creationTimestamp": "2026-11-30T09:00:00Z",
            "ownerReferences": [{"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "name": "prod",
                                 "uid": "3c0a0000-0000-4000-8000-000000000001"}]}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T10:00:00Z"
        meta["deletionGracePeriodSeconds"] = 0
    spec = {"module": {"files": {"main.tf": "resource \"terraform_data\" \"vm\" {\n  count = 2\n}\n"}},
            "variables": {"name": name}, "env": [{"name": "TF_VAR_token", "secretKeyRef": {"name": "cloud-creds", "key": "token"}}],
            "runner": {"image": "hashicorp/terraform:1.11.4", "timeoutSeconds": 3600}}
    return {"apiVersion": "infrastructure.cluster.x-k8s.io/v1alpha1", "kind": kind, "metadata": meta, "spec": spec}, f"{name}.{short}"


def job(kind, name, uid, suffix, op, attempt, state):
    jname = f"captf-{suffix.replace('.', '-')}-{op}-{attempt}"
    labels = owner_labels(kind, name, uid)
    labels.update({f"{A}/operation": op, f"{A}/attempt": str(attempt)})
    status = {"startTime": "2026-12-01T10:00:05Z"}
    if state == "running":
        status["active"] = 1
    elif state == "failed":
        status.update({"failed": 1, "conditions": [
            {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": "2026-12-01T10:03:00Z"},
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit", "lastTransitionTime": "2026-12-01T10:03:01Z"}]})
    elif state == "complete":
        status.update({"succeeded": 1, "completionTime": "2026-12-01T10:02:00Z", "conditions": [
            {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": "2026-12-01T10:02:00Z"},
            {"type": "Complete", "status": "True", "lastTransitionTime": "2026-12-01T10:02:00Z"}]})
    j = {"apiVersion": "batch/v1", "kind": "Job",
         "metadata": {"name": jname, "namespace": NS, "labels": labels, "uid": f"{uid[:-4]}{attempt:04d}",
                      "creationTimestamp": "2026-12-01T10:00:05Z"},
         "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": labels},
                  "spec": {"restartPolicy": "Never", "containers": [{"name": "terraform", "image": "hashicorp/terraform:1.11.4"}]}}},
         "status": status}
    pod_labels = dict(labels, **{"job-name": jname, "batch.kubernetes.io/job-name": jname})
    if state == "running":
        cstate = {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
        phase = "Pending"
    elif state == "failed":
        cstate = {"terminated": {"exitCode": 1, "reason": "Error",
                                 "message": "Error: deleting VM web-1-0: 403 Forbidden: the credentials lack compute.instances.delete"}}
        phase = "Failed"
    else:
        cstate = {"terminated": {"exitCode": 0, "reason": "Completed"}}
        phase = "Succeeded"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"{jname}-x7k2p", "namespace": NS, "labels": pod_labels},
           "spec": {"restartPolicy": "Never", "containers": [{"name": "terraform", "image": "hashicorp/terraform:1.11.4"}]},
           "status": {"phase": phase, "containerStatuses": [{"name": "terraform", "ready": False, "restartCount": 0,
                      "image": "hashicorp/terraform:1.11.4", "imageID": "", "state": cstate}]}}
    return [j, pod]


def write(filename, comment, docs):
    with open(os.path.join(OUT, filename), "w") as f:
        f.write(f"# {comment}\n")
        for d in docs:
            f.write("---\n")
            f.write(yaml.safe_dump(d, sort_keys=True, default_flow_style=False, width=1000))


def main():
    applied, destroyed = terraform_states()
    state = json.loads(applied)
    lineage, serial = state["lineage"], state["serial"]
    fp = {f"{A}/applied-at": "2026-11-30T09:00:10Z", f"{A}/state-lineage": lineage, f"{A}/state-serial": str(serial)}
    uid = lambda n: f"7e3f0000-0000-4000-8000-00000000{n:04d}"
    m = lambda n, ann, **kw: obj("TerraformMachine", "web-1", uid(n), ann, **kw)

    set_ns("row1-paused")
    o, s = m(1, dict(fp))
    write("row1-paused.yaml", "Row 1: the owning Cluster is paused: only Job bookkeeping.",
          [cluster(paused=True), o, state_secret(s, applied), inputs_secret("TerraformMachine", "web-1", uid(1), s), creds_secret()])

    set_ns("row2-waiting-for-job")
    o, s = m(2, dict(fp))
    write("row2-waiting-for-job.yaml", "Row 2: an apply Job of the object has not finished; its Pod cannot pull its image.",
          [cluster(), o, state_secret(s, applied), inputs_secret("TerraformMachine", "web-1", uid(2), s), creds_secret(),
           *job("TerraformMachine", "web-1", uid(2), s, "apply", 1, "running")])

    set_ns("row3-dependents")
    c, cs = obj("TerraformCluster", "prod", uid(3), dict(fp))
    w2, _ = obj("TerraformMachine", "web-2", uid(4), dict(fp), deleting=True)
    p1, _ = obj("TerraformMachinePool", "workers", uid(5), dict(fp), deleting=False)
    write("row3-dependents.yaml", "Row 3: a TerraformCluster whose machines and pools still exist.",
          [cluster(), c, w2, p1, state_secret(cs, applied), inputs_secret("TerraformCluster", "prod", uid(3), cs), creds_secret()])

    set_ns("row4-never-applied")
    o, s = m(6, {})
    write("row4-never-applied.yaml", "Row 4: no state Secret and never applied: released at once.", [cluster(), o])

    set_ns("row5-state-lost")
    o, s = m(7, dict(fp))
    write("row5-state-lost.yaml", "Row 5: applied before, but the state Secret is gone: held as StateLost.",
          [cluster(), o, inputs_secret("TerraformMachine", "web-1", uid(7), s), creds_secret()])

    set_ns("row6-state-corrupt")
    o, s = m(8, dict(fp))
    write("row6-state-corrupt.yaml", "Row 6: the state Secret holds a truncated gzip: held as StateCorrupt.",
          [cluster(), o, state_secret(s, gz=gzip.compress(applied, mtime=0)[:200]), inputs_secret("TerraformMachine", "web-1", uid(8), s), creds_secret()])

    set_ns("row6-state-encrypted")
    o, s = m(9, dict(fp))
    enc = json.dumps({"serial": serial, "lineage": lineage, "meta": {"key_provider.pbkdf2.main": "eyJzYWx0IjoiIn0="},
                      "encrypted_data": b64(os.urandom(64)), "encryption_version": "v0"}).encode()
    write("row6-state-encrypted.yaml", "Row 6: an OpenTofu-encrypted state: held as StateEncrypted.",
          [cluster(), o, state_secret(s, enc), inputs_secret("TerraformMachine", "web-1", uid(9), s), creds_secret()])

    set_ns("row6-state-inconsistent")
    o, s = m(10, dict(fp, **{f"{A}/state-serial": str(serial + 10)}))
    write("row6-state-inconsistent.yaml", "Row 6: the state's serial is lower than the recorded one (an older backup restored): held as StateInconsistent.",
          [cluster(), o, state_secret(s, applied), inputs_secret("TerraformMachine", "web-1", uid(10), s), creds_secret()])

    set_ns("row7-destroy")
    o, s = m(11, dict(fp))
    write("row7-destroy.yaml", "Row 7: a readable state with 2 managed instances, untried: a destroy Job starts.",
          [cluster(), o, state_secret(s, applied), inputs_secret("TerraformMachine", "web-1", uid(11), s, env=[{"name": "TF_VAR_token", "secretKeyRef": {"name": "cloud-creds", "key": "token"}}]), creds_secret()])

    set_ns("row8-cleanup")
    o, s = m(12, dict(fp, **{f"{A}/destroy-attempt": "1", f"{A}/deletion-uid": uid(12)}))
    write("row8-cleanup.yaml", "Row 8: the destroy succeeded and the state describes no instance: cleanup, then the finalizer comes off.",
          [cluster(), o, state_secret(s, destroyed), inputs_secret("TerraformMachine", "web-1", uid(12), s), creds_secret(),
           *job("TerraformMachine", "web-1", uid(12), s, "destroy", 1, "complete")])

    set_ns("row8-cleanup-marker")
    o, s = m(13, dict(fp, **{f"{A}/destroy-attempt": "1", f"{A}/deletion-uid": uid(13), f"{A}/cleanup-started": "destroyed"}))
    write("row8-cleanup-marker.yaml", "Row 8: cleanup had started (state Secret already deleted) when the manager restarted: cleanup continues, no false StateLost.",
          [cluster(), o])

    set_ns("row9-destroy-failed")
    o, s = m(14, dict(fp, **{f"{A}/destroy-attempt": "2", f"{A}/deletion-uid": uid(14), f"{A}/destroy-failed-at": "2026-12-01T10:03:01Z"}))
    write("row9-destroy-failed.yaml", "Row 9: destroy attempt 2 failed with Terraform's error: retried with backoff.",
          [cluster(), o, state_secret(s, applied), inputs_secret("TerraformMachine", "web-1", uid(14), s), creds_secret(),
           *job("TerraformMachine", "web-1", uid(14), s, "destroy", 2, "failed")])

    set_ns("row9-cannot-start")
    o, s = m(15, dict(fp))
    write("row9-cannot-start.yaml", "Row 9: the credentials Secret the inputs reference is gone: the destroy cannot start.",
          [cluster(), o, state_secret(s, applied), inputs_secret("TerraformMachine", "web-1", uid(15), s, env=[{"name": "TF_VAR_token", "secretKeyRef": {"name": "cloud-creds", "key": "token"}}])])

    set_ns("row9-namespace-terminating")
    o, s = m(16, dict(fp))
    nsobj = {"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": NS, "deletionTimestamp": "2026-12-01T09:59:00Z"},
             "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Terminating"}}
    write("row9-namespace-terminating.yaml", "Row 9: the namespace is terminating: Kubernetes refuses the destroy Job.",
          [nsobj, cluster(), o, state_secret(s, applied), inputs_secret("TerraformMachine", "web-1", uid(16), s), creds_secret()])

    set_ns("abandon-state-lost")
    o, s = m(17, dict(fp, **{f"{A}/abandon": uid(17)}))
    write("abandon-state-lost.yaml", "Row 5 with the abandon annotation: released without a destroy, the Secrets kept.",
          [cluster(), o, inputs_secret("TerraformMachine", "web-1", uid(17), s), creds_secret()])

    set_ns("not-deleting")
    o, s = m(18, dict(fp), deleting=False)
    write("not-deleting.yaml", "An object that is not being deleted.", [cluster(), o, state_secret(s, applied)])


if __name__ == "__main__":
    sys.exit(main())
