# A machine module whose file starts with a UTF-8 byte order mark, as some editors
# write it.

variable "captf_object_name" {
  type = string
}

resource "terraform_data" "instance" {
  input = var.captf_object_name
}

output "provider_id" {
  value = "captf:///${terraform_data.instance.id}"
}
