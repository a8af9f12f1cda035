"""Tidewater shared vocabulary.

The modules directly in this package (``events``, ``model``, ``errors``, ``config``, ``filter``, ``uri``,
``ts``) are the shared vocabulary: they import nothing else of Tidewater. ``cdc.meta`` (the etcd
meta-store) imports only the vocabulary. The ``cdc`` command is the top-level package ``cli``.
"""
