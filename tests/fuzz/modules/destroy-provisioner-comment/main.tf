# A machine module whose destroy-time provisioner has a comment that names the
# bootstrap data variable: a comment is no reference.

variable "captf_bootstrap_data" {
  type      = string
  sensitive = true
}

variable "captf_object_name" {
  type = string
}

resource "terraform_data" "instance" {
  input = {
    name      = var.captf_object_name
    user_data = sha256(var.captf_bootstrap_data)
  }

  provisioner "local-exec" {
    when = destroy
    # Not var.captf_bootstrap_data: a destroy may refer to self only.
    command = "echo destroyed ${self.id} # not var.captf_bootstrap_data either"
  }
}

output "provider_id" {
  value = "captf:///${terraform_data.instance.id}"
}
