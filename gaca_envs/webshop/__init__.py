"""WebShop: our engine with WebShop's reward, catalogues, local site and browser env."""
