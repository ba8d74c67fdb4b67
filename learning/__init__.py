"""Training private and proxy models for FedType (paper 002): architectures, rounds, UARL."""
