"""HTTP routers, one per resource; handlers stay thin and call the service modules."""
