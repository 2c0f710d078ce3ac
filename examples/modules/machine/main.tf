# A machine module of CAPTF's module contract v1 that makes no cloud resource: a
# terraform_data stands for the instance. Check it with
#   captf module check examples/modules/machine --role machine

variable "captf_object_name" {
  type = string
}

variable "captf_tags" {
  type = map(string)
}

variable "captf_bootstrap_data" {
  type      = string
  sensitive = true
}

variable "captf_failure_domain" {
  type    = string
  default = null
}

# The module's own variable, given in the TerraformMachine's spec.variables.
variable "size" {
  type    = string
  default = "small"
}

resource "terraform_data" "instance" {
  input = {
    name           = var.captf_object_name
    size           = var.size
    tags           = var.captf_tags
    zone           = var.captf_failure_domain
    bootstrap_hash = sha256(var.captf_bootstrap_data)
  }
}

output "provider_id" {
  value = "fake://${terraform_data.instance.id}"
}

output "addresses" {
  value = [{ type = "InternalIP", address = "10.0.0.10" }]
}

output "failure_domain" {
  value = var.captf_failure_domain
}
