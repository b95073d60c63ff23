"""OCI images as environments (SPEC §16): references, the layer store, pulling, unpacking, archives."""
