"""Webhooks: tenants register endpoints, batch events are queued in the transaction that ends the
batch, and workers deliver them signed per Standard Webhooks, retrying with backoff for 24 h."""
