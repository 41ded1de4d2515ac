"""The dashboard side: collector server, GPU and host samplers, the store.  Never imports torch."""
