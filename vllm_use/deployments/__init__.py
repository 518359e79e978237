"""Deployments: named, saved ways to serve a registered model (docs/router.md)."""
