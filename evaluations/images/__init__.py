"""Images: OCI images and Dockerfiles as environments, with no container daemon (SPEC §16)."""
