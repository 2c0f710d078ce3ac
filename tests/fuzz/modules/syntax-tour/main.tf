/* A machine module that uses the syntax the reader skips over: block comments,
   "strings" with { braces }, interpolations and directives, heredocs, nested and
   dynamic blocks, for expressions, and attributes over several lines. */

terraform {
  required_version = ">= 1.5"
}

variable "captf_object_name" {
  type        = string
  description = "the object's name { not a block }"
}

variable "captf_tags" {
  type    = map(string)
  default = {}
}

variable "disks" {
  type = list(object({
    name = string
    size = optional(number, 10)
  }))
  default = [
    { name = "root" },
    { name = "data", size = 100 }, // the data disk
  ]
}

variable "script" {
  type    = string
  default = <<-EOT
    #!/bin/sh
    echo "$${HOME} } {"
    variable "not_a_variable" {}
  EOT
}

locals {
  names = [for d in var.disks : "${var.captf_object_name}-${d.name}"]
  label = "%{if length(var.captf_tags) > 0}tagged%{else}untagged%{endif}"
  nested = "a ${"b ${"c"}"} d"
}

resource "terraform_data" "disk" {
  for_each = { for d in var.disks : d.name => d }
  input = {
    name = each.key
    size = each.value.size
  }

  lifecycle {
    ignore_changes = [
      input,
    ]
  }
}

resource "terraform_data" "instance" {
  input = {
    names  = local.names
    label  = local.label
    nested = local.nested
    script = var.script
  }

  provisioner "local-exec" {
    when    = destroy
    command = <<EOT
echo "destroying ${self.id}"
EOT
  }
}

output "provider_id" {
  value = "captf:///${terraform_data.instance.id}"
}

output "addresses" {
  value = [
    for i, n in local.names : {
      type    = "InternalIP"
      address = "10.0.0.${i + 1}"
    }
  ]
}

output "not_a_contract_output" {
  value     = local.label
  sensitive = false
}
