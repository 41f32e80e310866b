"""Real images that ship inside installed wheels, as batches for models (no downloads)."""

from __future__ import annotations

import numpy as np

from ..cli.arguments import IMAGENET_MEAN, IMAGENET_STD

#: scikit-image sample photos in RGB (name -> loader attribute of ``skimage.data``).
SKIMAGE_PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field",
                  "immunohistochemistry", "retina", "cat")


def sample_images(count: int = 8, size: int = 224) -> np.ndarray:
    """``count`` real photos as a uint8 ``(N, size, size, 3)`` batch, cycling if needed.

    The photos are scikit-image's and scikit-learn's bundled samples, centre-cropped to a square
    and resized with Pillow's bilinear filter.
    """
    from PIL import Image

    if count < 1 or size < 1:
        raise ValueError(f"count and size must be positive; got count={count}, size={size}")
    photos = _photos()
    batch = np.empty((count, size, size, 3), dtype=np.uint8)
    for i in range(count):
        photo = photos[i % len(photos)]
        height, width = photo.shape[:2]
        side = min(height, width)
        top, left = (height - side) // 2, (width - side) // 2
        crop = Image.fromarray(photo[top:top + side, left:left + side])
        batch[i] = np.asarray(crop.resize((size, size), Image.BILINEAR))
    return batch


def photo_list() -> list[np.ndarray]:
    """The bundled photos as a list of uint8 ``(H, W, 3)`` arrays of their own sizes."""
    return _photos()


def _photos() -> list[np.ndarray]:
    import skimage.data

    photos = []
    for name in SKIMAGE_PHOTOS:
        loader = getattr(skimage.data, name, None)
        if loader is None:
            continue
        image = loader()
        if image.ndim == 3 and image.shape[2] >= 3:
            photos.append(np.ascontiguousarray(image[:, :, :3]).astype(np.uint8))
    try:
        from sklearn.datasets import load_sample_images

        photos.extend(load_sample_images().images)
    except ImportError:
        pass
    return photos


def normalize(batch: np.ndarray, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> np.ndarray:
    """uint8 NHWC images to float32 NCHW, scaled to [0, 1] and normalized per channel."""
    if batch.ndim != 4 or batch.shape[-1] != 3:
        raise ValueError(f"expected an (N, H, W, 3) batch; got shape {batch.shape}")
    scaled = batch.astype(np.float32) / 255.0
    scaled = (scaled - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(scaled.transpose(0, 3, 1, 2))


#: ImageNet normalization in the units of uint8 pixels, for ``input_normalization``:
#: ``(x - mean) / std`` per RGB channel equals ``(x / 255 - IMAGENET_MEAN) / IMAGENET_STD``.
IMAGENET_UINT8 = {"mean": [255.0 * m for m in IMAGENET_MEAN],
                  "std": [255.0 * s for s in IMAGENET_STD]}


class ImageBatches:
    """uint8 image batches of a fixed size, ready for a model whose input is declared uint8.

    Images are file paths or ``(H, W, 3)`` uint8 arrays; each is centre-cropped to a square and
    resized with Pillow. Pixels stay uint8 all the way: no float copy is made on the host.

    Parameters
    ----------
    images : sequence of str or numpy.ndarray
    size : int
        Output height and width.
    batch_size : int
    layout : {"NCHW", "NHWC"}

    Examples
    --------
    >>> batches = ImageBatches(sample_images(4, 64), size=32, batch_size=2)
    >>> [b.shape for b in batches]
    [(2, 3, 32, 32), (2, 3, 32, 32)]
    """

    def __init__(self, images, size: int, batch_size: int = 1, layout: str = "NCHW"):
        if layout not in ("NCHW", "NHWC"):
            raise ValueError(f"layout must be 'NCHW' or 'NHWC'; got {layout!r}")
        if size < 1 or batch_size < 1:
            raise ValueError(f"size and batch_size must be positive; got {size}, {batch_size}")
        self.images = list(images)
        if not self.images:
            raise ValueError("ImageBatches needs at least one image")
        self.size, self.batch_size, self.layout = size, batch_size, layout

    def __len__(self) -> int:
        return -(-len(self.images) // self.batch_size)

    def _load(self, image) -> np.ndarray:
        from PIL import Image

        if isinstance(image, (str, bytes)) or hasattr(image, "__fspath__"):
            picture = Image.open(image).convert("RGB")
        else:
            array = np.asarray(image)
            if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
                raise ValueError("image arrays must be (H, W, 3) uint8; got "
                                 f"{array.shape} {array.dtype}")
            picture = Image.fromarray(array)
        side = min(picture.size)
        left, top = (picture.width - side) // 2, (picture.height - side) // 2
        picture = picture.crop((left, top, left + side, top + side))
        return np.asarray(picture.resize((self.size, self.size), Image.BILINEAR), dtype=np.uint8)

    def __iter__(self):
        for start in range(0, len(self.images), self.batch_size):
            batch = np.stack([self._load(i) for i in self.images[start:start + self.batch_size]])
            if self.layout == "NCHW":
                batch = batch.transpose(0, 3, 1, 2)
            yield np.ascontiguousarray(batch)
