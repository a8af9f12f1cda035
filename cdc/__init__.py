"""Tidewater shared vocabulary.

The modules directly in this package (``events``, ``model``, ``errors``, ``config``, ``filter``, ``uri``,
``ts``) are the shared vocabulary: they import nothing else of Tidewater. ``cdc.meta`` (the etcd
meta-store) imports only the vocabulary; ``cdc.cli`` is the top layer and may import everything.
"""
