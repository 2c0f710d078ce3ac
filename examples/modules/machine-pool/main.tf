# A machine-pool module of CAPTF's module contract v1 that makes no cloud resource: one
# terraform_data per replica stands for the instances. Check it with
#   captf module check examples/modules/machine-pool --role machine-pool

variable "captf_object_name" {
  type = string
}

variable "captf_replicas" {
  type = number
}

variable "captf_bootstrap_data" {
  type      = string
  sensitive = true
}

variable "captf_cluster_outputs" {
  type    = any
  default = null
}

resource "terraform_data" "instance" {
  count = var.captf_replicas
  input = {
    name           = "${var.captf_object_name}-${count.index}"
    subnet         = try(var.captf_cluster_outputs.subnet, null)
    bootstrap_hash = sha256(var.captf_bootstrap_data)
  }
}

output "provider_id_list" {
  value = [for i in terraform_data.instance : "fake://${i.id}"]
}

output "replicas" {
  value = length(terraform_data.instance)
}
