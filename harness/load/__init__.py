"""How a strategy gets a checkpoint's weights into a model: the strategy registry and the peers' loaders."""
