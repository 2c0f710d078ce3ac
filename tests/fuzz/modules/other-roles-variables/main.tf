# A pool module that declares a variable of another role's contract (left at its
# default: a warning) beside its own and its role's.

variable "captf_replicas" {
  type = number
}

variable "captf_machine_name" {
  type    = string
  default = ""
}

variable "flavour" {
  type    = string
  default = "small"
}

resource "terraform_data" "node" {
  count = var.captf_replicas
  input = "${var.flavour}-${count.index}"
}

output "provider_id_list" {
  value = [for n in terraform_data.node : "captf:///${n.id}"]
}
