"""Draw the README's picture: the saturated e-graph of sqrt(1 + x) - sqrt(x), e-classes as
clusters, the extracted program's e-nodes filled. `python scripts/readme_picture.py [out.svg]`"""
import sys

import torch

from egraph_opt import explore, saturate_and_extract
from egraph_opt.drivers.pictures import SVG, egraph_picture


@saturate_and_extract(input_ranges={"x": (1.0, 1e6)})
def f(x):
    return torch.sqrt(1 + x) - torch.sqrt(x)


if __name__ == "__main__":
    f(torch.rand(8) * 100 + 1)
    picture = egraph_picture(explore(f))
    if type(picture) is not SVG:  # a TextPicture: no dot, or too large
        sys.exit(str(picture).splitlines()[0])
    print(picture.save(sys.argv[1] if len(sys.argv) > 1 else "docs/explore_egraph.svg"))
