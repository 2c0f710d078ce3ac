# A cluster module of CAPTF's module contract v1 that makes no cloud resource: a
# terraform_data stands for the network and the load balancer. Check it with
#   captf module check examples/modules/cluster --role cluster

variable "captf_cluster_name" {
  type = string
}

variable "captf_tags" {
  type = map(string)
}

variable "captf_control_plane_endpoint" {
  type    = object({ host = string, port = number })
  default = null
}

resource "terraform_data" "load_balancer" {
  input = {
    cluster = var.captf_cluster_name
    tags    = var.captf_tags
  }
}

output "control_plane_endpoint" {
  # Provided by this module only when the Cluster has none.
  value = var.captf_control_plane_endpoint == null ? { host = "lb.${var.captf_cluster_name}.example", port = 6443 } : null
}

output "failure_domains" {
  value = [
    { name = "zone-a", control_plane = true },
    { name = "zone-b", control_plane = true },
  ]
}

output "machine_inputs" {
  value = { subnet = "subnet-${terraform_data.load_balancer.id}" }
}
