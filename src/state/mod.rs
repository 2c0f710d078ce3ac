//! Reading a Terraform state from its Secret(s) in the kubernetes-backend format: joining
//! part Secrets, streaming gunzip under a decompression cap, and classifying the result
//! (SPEC section 4, "State readability"). Placeholder: filled in by the state-reading work.
