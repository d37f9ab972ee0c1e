"""The one order before anything is rendered, built, baked, installed or verified
(`prepare.prepare`: the lock, its pins, the mirror set, into a render.context.BuildContext), and
`envbuild render` whole (`render.py`). Ranked above lock/ and render/, which it joins.
"""
