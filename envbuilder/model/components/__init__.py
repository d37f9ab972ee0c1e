"""Components as building blocks (hpccm's shape): one module per component owns its selection
rules, its pins, its build steps and its checks; the resolver and the renderers call it."""
