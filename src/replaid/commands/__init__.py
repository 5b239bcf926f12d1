"""Sub-commands of ``replaid`` that live in their own modules (see ``cli.PLUGIN_MODULES``)."""
