# A cluster module whose contract variables' object types are written over several
# lines, without commas, as `terraform fmt` lays them out.

variable "captf_cluster_name" {
  type = string
}

variable "captf_control_plane_endpoint" {
  type = object({
    host = string
    port = number
  })
  default = null
}

variable "captf_cluster_network" {
  type = object({
    pods     = list(string) # the Pod CIDRs
    services = list(string)
    // the cluster's DNS domain
    service_domain = string
  })
}

resource "terraform_data" "load_balancer" {
  input = var.captf_cluster_name
}

output "control_plane_endpoint" {
  value = { host = "lb.example", port = 6443 }
}

output "failure_domains" {
  value = [{ name = "zone-a", control_plane = true }]
}
