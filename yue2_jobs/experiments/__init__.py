"""A/B experiments: variants assigned to batch requests (`service`), compared with confidence intervals (`report`)."""
