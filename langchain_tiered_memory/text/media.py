"""What a media block costs a model: images, audio, video and files.

A provider charges media by what it holds, not by the block: an image by its size,
audio and video by their length, a PDF by its pages. Each count here is the most
that one of the large providers charges (OpenAI, Anthropic, Google), read from the
block's own data, so a window of media never outgrows the model's context. What
cannot be read (a URL, a file id, data of an unknown format) is charged a fixed
amount or by the length of its data.

Blocks come in LangChain's standard shapes (v0 and v1) and the providers' own
(OpenAI's Chat Completions and Responses, Anthropic's).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import imagesize

#: Image blocks: charged by their size, read from the header of their base64 data.
IMAGE_BLOCKS = frozenset({"image", "image_url", "input_image"})
#: Audio blocks: charged by their length.
AUDIO_BLOCKS = frozenset({"audio", "input_audio"})
#: Video blocks: charged by their length.
VIDEO_BLOCKS = frozenset({"video"})
#: File blocks: a PDF by its pages, a text by its text, anything else by its bytes.
FILE_BLOCKS = frozenset({"file", "input_file", "document"})
#: Every media block counted here.
MEDIA_BLOCKS = IMAGE_BLOCKS | AUDIO_BLOCKS | VIDEO_BLOCKS | FILE_BLOCKS

#: Tokens charged for an image whose size cannot be read: about the most a provider
#: charges for one image (Anthropic about 1,600 at its 1.15 megapixel cap; OpenAI's
#: high detail at most 1,445).
TOKENS_PER_UNSIZED_IMAGE = 1600
#: Tokens charged for audio, video or a file given only by a URL or a file id: as
#: much as an unsized image, since nothing of it can be read here.
TOKENS_PER_UNREAD_MEDIA = 1600
#: Gemini's 32 tokens per second of audio (OpenAI's audio models charge less).
TOKENS_PER_AUDIO_SECOND = 32
#: Gemini's 258 tokens per frame at one frame a second, plus 32 for its audio.
TOKENS_PER_VIDEO_SECOND = 290
#: Anthropic's upper figure for a PDF page (its text, and the page as an image).
TOKENS_PER_PDF_PAGE = 3000
#: Bytes a second assumed for audio whose length cannot be read: 16 kbit/s, a voice
#: codec's (a lower rate than music's, so a length is overestimated, not under).
AUDIO_BYTES_PER_SECOND = 2000
#: Bytes a second assumed for video whose length cannot be read: 250 kbit/s.
VIDEO_BYTES_PER_SECOND = 31_250
#: The fewest bytes a second believed of a header's length (800 bit/s, below any
#: speech codec in use): a header is untrusted, and its bytes bound what they hold.
MIN_BYTES_PER_SECOND = 100
#: Bytes per token of a file that is neither a PDF nor text (as text's four
#: characters a token).
BYTES_PER_TOKEN = 4

#: Base64 characters decoded to find an image's size: its header (a JPEG's may
#: follow tens of kilobytes of EXIF data).
IMAGE_HEADER_CHARS = 128 * 1024
#: The largest image side believed from a header (2**31 pixels, as PNG's limit).
MAX_IMAGE_SIDE = 2**31 - 1
#: Counts kept (a message is counted again at every turn; its data may be megabytes).
CACHE_SIZE = 4096

_cache: OrderedDict[tuple[str, int, int], int] = OrderedDict()


def media_tokens(block: dict[str, Any], text_tokens: Callable[[str], int]) -> int:
    """What a media block costs a model, in tokens.

    Args:
        block: A content block whose ``type`` is in :data:`MEDIA_BLOCKS`.
        text_tokens: How the text of a text document is counted.

    Returns:
        An image's tokens by :func:`image_tokens`; a text document's by
        ``text_tokens``; audio at :data:`TOKENS_PER_AUDIO_SECOND`
        and video at :data:`TOKENS_PER_VIDEO_SECOND` for the length read from
        their data (audio at :data:`AUDIO_BYTES_PER_SECOND`, video at
        :data:`VIDEO_BYTES_PER_SECOND` when it cannot be read); a PDF at
        :data:`TOKENS_PER_PDF_PAGE` a page, other files by their text or
        :data:`BYTES_PER_TOKEN`; :data:`TOKENS_PER_UNREAD_MEDIA` for what a URL or
        a file id names.
    """
    kind = block.get("type")
    if kind in IMAGE_BLOCKS:
        return image_tokens(block)
    text = _inline_text(block)
    if text is not None:
        return text_tokens(text)
    data = _base64_of(block)
    if data is None:
        return TOKENS_PER_UNREAD_MEDIA
    encoded, start = data
    head = encoded[start : start + IMAGE_HEADER_CHARS]
    # Kept by the data's start and length: hashing and reading all of it at every
    # turn is what the cache saves.
    key = (str(kind), hash(head), len(encoded) - start)
    found = _cache.get(key)
    if found is None:
        found = _cache[key] = _read(str(kind), _decode(encoded[start:]), text_tokens)
        if len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return found


def image_tokens(block: dict[str, Any]) -> int:
    """What the most expensive of the large providers charges for an image block.

    The larger of OpenAI's high-detail tiles (170 per 512-pixel tile of the image
    fitted in 2048 and its short side in 768, plus 85) and Anthropic's pixels / 750
    (at most 1,568 pixels on the long side and 1.15 megapixels), for the size read
    from the header of its base64 data; :data:`TOKENS_PER_UNSIZED_IMAGE` when the
    size cannot be read. OpenAI's ``detail: "low"`` is not taken at its word:
    other providers' integrations drop it and charge the whole image.
    """
    data = _base64_of(block)
    if data is None:
        return TOKENS_PER_UNSIZED_IMAGE
    encoded, start = data
    head = encoded[start : start + IMAGE_HEADER_CHARS]
    key = ("image", hash(head), len(head))
    found = _cache.get(key)
    if found is None:
        found = _cache[key] = _image_tokens(head)
        if len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return found


def _image_tokens(head: str) -> int:
    size = _image_size(head)
    if size is None:
        return TOKENS_PER_UNSIZED_IMAGE
    width, height = size
    fit = min(1.0, 2048 / max(width, height))
    fit *= min(1.0, 768 / (min(width, height) * fit))
    tiles = math.ceil(width * fit / 512) * math.ceil(height * fit / 512)
    shrink = min(1.0, 1568 / max(width, height), math.sqrt(1_150_000 / (width * height)))
    return max(170 * tiles + 85, math.ceil(width * height * shrink * shrink / 750))


def _image_size(head: str) -> tuple[int, int] | None:
    """An image's width and height from the start of its base64 data, if readable.

    Sizes come from untrusted bytes: only whole numbers of pixels up to
    :data:`MAX_IMAGE_SIDE` count (an SVG's are floats, ``inf`` included).
    """
    try:
        raw = base64.b64decode(head[: len(head) - len(head) % 4])
        width, height = imagesize.get(io.BytesIO(raw))
    except Exception:  # not base64, or not an image imagesize knows: charged as unsized
        return None
    sides = (width, height)
    if all(type(side) is int and 0 < side <= MAX_IMAGE_SIDE for side in sides):
        return width, height
    return None


def _inline_text(block: dict[str, Any]) -> str | None:
    """The text of a document given as text (Anthropic's ``source`` of type ``text``)."""
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "text":
        return str(source.get("data") or "")
    if block.get("source_type") == "text":  # LangChain's standard block (v0)
        return str(block.get("text") or "")
    return None


def _base64_of(block: dict[str, Any]) -> tuple[str, int] | None:
    """A media block's base64 data and where it starts in that string, if inline.

    Not copied: the data may be megabytes, and the block is counted at every turn.
    """
    source = block.get("source")
    inner = block.get(str(block.get("type")))  # OpenAI's {"type": "file", "file": {...}}
    candidates: list[Any] = []
    if isinstance(source, dict):  # Anthropic
        candidates.append(source.get("data") if source.get("type") == "base64" else None)
    else:
        candidates += [block.get("base64"), block.get("data"), block.get("file_data")]
        candidates += [block.get("image_url"), block.get("url")]
        if isinstance(inner, dict):  # OpenAI Chat Completions
            candidates += [inner.get("data"), inner.get("file_data"), inner.get("url")]
    for value in candidates:
        if isinstance(value, dict):  # {"image_url": {"url": ...}}
            value = value.get("url")
        if not isinstance(value, str):
            continue
        if value.startswith("data:"):
            comma = value.find(",", 0, 256)
            if comma > 0 and value[:comma].endswith(";base64"):
                return value, comma + 1
            continue
        if value and "://" not in value[:16]:  # base64 as it is, not a URL
            return value, 0
    return None


def _decode(encoded: str) -> bytes | None:
    try:
        return base64.b64decode(encoded[: len(encoded) - len(encoded) % 4])
    except (binascii.Error, ValueError):  # not base64 (or not ASCII)
        return None


def _read(kind: str, raw: bytes | None, text_tokens: Callable[[str], int]) -> int:
    """The tokens of media ``raw`` of block type ``kind`` (see :func:`media_tokens`)."""
    if raw is None:
        return TOKENS_PER_UNREAD_MEDIA
    if kind in AUDIO_BLOCKS or kind in VIDEO_BLOCKS:
        per_second, rate = (
            (TOKENS_PER_AUDIO_SECOND, AUDIO_BYTES_PER_SECOND)
            if kind in AUDIO_BLOCKS
            else (TOKENS_PER_VIDEO_SECOND, VIDEO_BYTES_PER_SECOND)
        )
        seconds = _length(raw)
        if seconds is None:
            seconds = len(raw) / rate
        seconds = min(seconds, len(raw) / MIN_BYTES_PER_SECOND)
        return max(1, math.ceil(seconds * per_second))
    if raw.startswith(b"%PDF"):
        pages = _pages(raw)
        if pages is not None:
            return pages * TOKENS_PER_PDF_PAGE
    try:
        return text_tokens(raw.decode("utf-8"))  # a text file: counted as its text
    except UnicodeDecodeError:
        return math.ceil(len(raw) / BYTES_PER_TOKEN)


def _length(raw: bytes) -> float | None:
    """Seconds of audio or video, from its header (WAV, MP3, MP4, Ogg, FLAC, ...)."""
    return _untrusted(lambda: _mutagen_length(raw))


def _mutagen_length(raw: bytes) -> float | None:
    import mutagen  # imported when media is first counted: most turns have none

    found = mutagen.File(io.BytesIO(raw))
    return None if found is None else float(found.info.length)


def _pages(raw: bytes) -> int | None:
    def count() -> int:
        import pypdf  # imported when a PDF is first counted

        return len(pypdf.PdfReader(io.BytesIO(raw), strict=False).pages)

    pages = _untrusted(count)
    return None if pages is None else int(pages)


def _untrusted(read: Callable[[], float | int | None]) -> float | None:
    """A length read from untrusted bytes, if it is a finite number above zero."""
    try:
        value = read()
    except Exception:  # a malformed or unknown file: its length is not known
        return None
    if value is None or not math.isfinite(value) or value <= 0:
        return None
    return float(value)
