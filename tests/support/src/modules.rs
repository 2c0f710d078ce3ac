//! The Terraform modules the scenarios apply and destroy, and running `terraform` by hand.

use super::*;

/// A module of two `terraform_data` instances whose destroy leaves a file per instance in
/// `marker_dir`, so a test can see that Terraform really destroyed them. With
/// `fail_destroys` > 0, the destroy provisioner fails that many times first.
pub fn module(fail_destroys: u32) -> String {
    destroy_module(&format!(
        "if [ $n -le {fail_destroys} ]; then echo 'Error: the cloud said no (attempt '$n')' >&2; exit 1; fi"
    ))
}

/// Two `terraform_data` instances whose create provisioner counts its runs in
/// `<marker>.applies`, fails the first `fail_applies` runs, then leaves `<marker>.created`;
/// their destroy leaves `<marker>.destroyed`. For the scenarios the manager applies.
pub fn apply_module(fail_applies: u32) -> String {
    format!(
        r#"variable "name" {{ type = string }}
variable "marker_dir" {{ type = string }}
resource "terraform_data" "vm" {{
  count = 2
  input = "${{var.marker_dir}}/${{var.name}}-${{count.index}}"
  provisioner "local-exec" {{
    command = "n=$(cat '${{self.input}}.applies' 2>/dev/null || echo 0); n=$((n+1)); echo $n > '${{self.input}}.applies'; if [ $n -le {fail_applies} ]; then echo 'Error: the cloud said no (apply '$n')' >&2; exit 1; fi; touch '${{self.input}}.created'"
  }}
  provisioner "local-exec" {{
    when    = destroy
    command = "touch '${{self.input}}.destroyed'"
  }}
}}
"#
    )
}

/// [`apply_module`] with a cluster's endpoint from the variable `endpoint` (port 6443).
pub fn endpoint_module() -> String {
    apply_module(0)
        + r#"variable "endpoint" { type = string }
output "control_plane_endpoint" {
  value = { host = var.endpoint, port = 6443 }
}
"#
}

/// The outputs module contract v1 reads from a module of `kind`, as a stand-in module
/// of two `terraform_data` instances (`vm`) gives them: a cluster's endpoint and failure
/// domains, a machine's provider ID and address, a pool's provider IDs and instances.
pub fn contract_outputs(kind: Kind) -> &'static str {
    match kind {
        Kind::TerraformCluster => {
            r#"output "control_plane_endpoint" {
  value = { host = "10.0.0.1", port = 6443 }
}
output "failure_domains" {
  value = [{ name = "az-1", control_plane = true }, { name = "az-2" }]
}
"#
        }
        Kind::TerraformMachine => {
            r#"output "provider_id" {
  value = "captf:///${var.name}"
}
output "addresses" {
  value = [{ type = "InternalIP", address = "10.0.1.1" }]
}
"#
        }
        Kind::TerraformMachinePool => {
            r#"output "provider_id_list" {
  value = [for i, vm in terraform_data.vm : "captf:///${var.name}-${i}"]
}
output "instances" {
  value = [for i, vm in terraform_data.vm : { provider_id = "captf:///${var.name}-${i}", failure_domain = "az-${i + 1}" }]
}
"#
        }
    }
}

/// Two `terraform_data` instances whose destroy provisioner counts its runs in
/// `<marker>.tries`, runs `first_runs` (a shell snippet that may test `$n`), then leaves
/// `<marker>.destroyed`.
///
/// On an outside cluster each attempt runs in a Pod of a machine the test cannot read,
/// so the count cannot be kept in a file: `$n` is then the attempt number, read off the
/// Pod's `HOSTNAME` (`<job name>-<random>`, the Job name ending in `-destroy-<attempt>`).
fn destroy_module(first_runs: &str) -> String {
    let count = if external_cluster().is_some() {
        "a=$${HOSTNAME%-*}; n=$${a##*-}"
    } else {
        "n=$(cat '${self.input}.tries' 2>/dev/null || echo 0); n=$((n+1)); echo $n > '${self.input}.tries'"
    };
    format!(
        r#"variable "name" {{ type = string }}
variable "marker_dir" {{ type = string }}
resource "terraform_data" "vm" {{
  count = 2
  input = "${{var.marker_dir}}/${{var.name}}-${{count.index}}"
  provisioner "local-exec" {{
    when    = destroy
    command = "{count}; {first_runs}; touch '${{self.input}}.destroyed'"
  }}
}}
"#
    )
}

/// A module whose destroy provisioner sleeps `seconds` on its first run (to be
/// interrupted, or to be seen running) and succeeds afterwards.
pub fn sleepy_module(seconds: u32) -> String {
    destroy_module(&format!("if [ $n -le 1 ]; then sleep {seconds}; fi"))
}

pub fn terraform(dir: &Path, args: &[&str]) {
    if let Err(e) = try_terraform(dir, args) {
        panic!("{e}");
    }
}

/// Runs `terraform` with `args` in `dir`; the error carries its output.
pub fn try_terraform(dir: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new(require("terraform"))
        .args(args)
        .current_dir(dir)
        .env("TF_IN_AUTOMATION", "1")
        .env("CHECKPOINT_DISABLE", "1")
        .env("HOME", dir)
        .env("TF_DATA_DIR", dir.join(".terraform-data"))
        .output()
        .expect("run terraform");
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "terraform {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}
