"""ringcomm inside other frameworks: the "ringcomm" backend of torch.distributed."""
