"""``python -m nerf_lightning.data.synthetic OUT_DIR ...``: see :func:`nerf_lightning.data.synthetic.main`."""

import sys

from nerf_lightning.data.synthetic.generate import main

sys.exit(main())
