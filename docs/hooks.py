"""MkDocs hooks: the reference pages' generated parts (see mkdocs.yml `hooks`)."""
