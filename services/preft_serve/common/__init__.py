"""Code shared by the registry, gateway and worker."""
