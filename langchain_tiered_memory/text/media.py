"""What a media block costs a model: images, audio, video and files.

A provider charges media by what it holds, not by the block: an image by its size,
audio and video by their length, a PDF by its pages. Each count here is the most
that one of the large providers charges (OpenAI, Anthropic, Google), read from the
block's own data, so a window of media never outgrows the model's context. What
cannot be read (a URL, a file id, data of an unknown format) is charged a fixed
amount or by the length of its data. Every length and page count read from a
header is untrusted: it is bounded by the bytes that hold it.

Blocks come in LangChain's standard shapes (v0 and v1) and the providers' own
(OpenAI's Chat Completions and Responses, Anthropic's, Google GenAI's ``media``
and ``file_data``, Bedrock Converse's blocks keyed by their kind).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
import zipfile
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeAlias

import imagesize

#: Image blocks: charged by their size, read from the header of their data.
IMAGE_BLOCKS = frozenset({"image", "image_url", "input_image"})
#: Audio blocks: charged by their length.
AUDIO_BLOCKS = frozenset({"audio", "input_audio"})
#: Video blocks: charged by their length.
VIDEO_BLOCKS = frozenset({"video"})
#: File blocks: a PDF by its pages, a text by its text, anything else by its bytes.
FILE_BLOCKS = frozenset({"file", "input_file", "document", "text-plain"})
#: Google GenAI's blocks of any media, told apart by their ``mime_type``.
MIME_BLOCKS = frozenset({"media", "file_data"})
#: Bedrock Converse's media blocks: no ``type``, one key naming the kind.
CONVERSE_BLOCKS = {
    "image": "image",
    "audio": "audio",
    "video": "video",
    "document": "file",
}

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
#: Bytes a second of OpenAI's ``pcm16`` audio (24 kHz, 16-bit, mono, no header).
PCM16_BYTES_PER_SECOND = 48_000
#: Bytes a second assumed for video whose length cannot be read: 250 kbit/s.
VIDEO_BYTES_PER_SECOND = 31_250
#: The fewest bytes a second believed of a header's length (800 bit/s, below any
#: speech codec in use).
MIN_BYTES_PER_SECOND = 100
#: The fewest bytes believed of a PDF page (a page object and its reference).
MIN_BYTES_PER_PAGE = 100
#: Bytes per token of a file that is neither a PDF, a text nor an office file (as
#: text's four characters a token).
BYTES_PER_TOKEN = 4
#: The most an office file's text members are read inflated, times its own size (a
#: zip bomb is read no further).
ZIP_MAX_RATIO = 20
#: The most members an office file is read with (its directory is read first).
ZIP_MAX_MEMBERS = 10_000
#: Members of an office file (docx, xlsx, pptx, odt, epub) that hold its text.
ZIP_TEXT = (".xml", ".rels", ".txt", ".xhtml", ".html", ".htm", ".csv", ".json")
# Markup around an office file's text.
_TAGS = re.compile(r"<[^<>]*+>")
#: The most bytes a token believed of a text file (UTF-8 Chinese: three bytes a
#: character of 1.3 tokens; English text about four characters a token).
MAX_BYTES_PER_TOKEN = 8

#: Base64 characters (or bytes) read to find an image's size, and to key the cache:
#: a header (a JPEG's may follow tens of kilobytes of EXIF data).
HEAD_CHARS = 128 * 1024
#: The largest image side believed from a header (2**31 pixels, as PNG's limit).
MAX_IMAGE_SIDE = 2**31 - 1
#: Counts kept (a message is counted again at every turn; its data may be megabytes).
CACHE_SIZE = 4096
#: Where a PDF's header may start (readers skip what comes before it).
PDF_HEADER_WITHIN = 1024
#: Chunks read of a WAV file before its data.
WAV_CHUNKS = 64
#: WAV format tags of uncompressed samples: PCM, IEEE float, extensible.
WAV_PCM = frozenset({1, 3, 0xFFFE})
#: The most bytes a second believed of audio (192 kHz, 32-bit, stereo): audio lasts
#: at least its bytes at this rate, whatever its header says.
MAX_AUDIO_BYTES_PER_SECOND = 1_536_000

#: A block's data: bytes as they are, or base64 text and where it starts in it.
Data: TypeAlias = bytes | tuple[str, int]

_cache: OrderedDict[tuple[Any, ...], int] = OrderedDict()


def media_kind(block: dict[str, Any]) -> str | None:
    """``"image"``, ``"audio"``, ``"video"`` or ``"file"`` for a media block, else ``None``."""
    kind = block.get("type")
    if kind is None:  # Bedrock Converse: {"video": {"format": ..., "source": ...}}
        for key, value in block.items():
            if key in CONVERSE_BLOCKS and isinstance(value, dict):
                return CONVERSE_BLOCKS[key]
        return None
    if not isinstance(kind, str):
        return None
    if kind in IMAGE_BLOCKS:
        return "image"
    if kind in AUDIO_BLOCKS:
        return "audio"
    if kind in VIDEO_BLOCKS:
        return "video"
    if kind in FILE_BLOCKS:
        return "file"
    if kind in MIME_BLOCKS:
        major = str(block.get("mime_type") or block.get("mimeType") or "").partition("/")[0]
        return major if major in ("image", "audio", "video") else "file"
    return None


def media_tokens(block: dict[str, Any], text_tokens: Callable[[str], int]) -> int:
    """What a media block costs a model, in tokens.

    Args:
        block: A content block of a :func:`media_kind`.
        text_tokens: How text is counted (a text document's, a document's title
            and context).

    Returns:
        An image's tokens by :func:`image_tokens`; a text document's by
        ``text_tokens``; audio at :data:`TOKENS_PER_AUDIO_SECOND` and video at
        :data:`TOKENS_PER_VIDEO_SECOND` for the length read from their data (audio
        at :data:`AUDIO_BYTES_PER_SECOND`, video at :data:`VIDEO_BYTES_PER_SECOND`
        when it cannot be read); a PDF at :data:`TOKENS_PER_PDF_PAGE` a page, other
        files by their text or :data:`BYTES_PER_TOKEN`;
        :data:`TOKENS_PER_UNREAD_MEDIA` for what a URL or a file id names.
    """
    kind = media_kind(block)
    if kind == "image":
        return image_tokens(block)
    extra = sum(text_tokens(block[key]) for key in ("title", "context") if _is_text(block, key))
    text = _inline_text(block)
    if text is not None:
        return extra + text_tokens(text)
    data = _data_of(block)
    if data is None:
        return extra + TOKENS_PER_UNREAD_MEDIA
    # OpenAI's audio answers (``pcm16``) have no header: their bytes tell their length.
    raw_rate = PCM16_BYTES_PER_SECOND if block.get("format") == "pcm16" else None
    key = (kind, raw_rate, *_key(data))
    return extra + _kept(key, lambda: _read(str(kind), _decode(data), text_tokens, raw_rate))


def image_tokens(block: dict[str, Any]) -> int:
    """What the most expensive of the large providers charges for an image block.

    The larger of OpenAI's high-detail tiles (170 per 512-pixel tile of the image
    fitted in 2048 and its short side in 768, plus 85) and Anthropic's pixels / 750
    (at most 1,568 pixels on the long side and 1.15 megapixels), for the size read
    from the header of its data; :data:`TOKENS_PER_UNSIZED_IMAGE` when the size
    cannot be read. OpenAI's ``detail: "low"`` is not taken at its word: other
    providers' integrations drop it and charge the whole image.
    """
    data = _data_of(block)
    if data is None:
        return TOKENS_PER_UNSIZED_IMAGE
    return _kept(("image", *_key(data)), lambda: _image_tokens(_head(data)))


def _kept(key: tuple[Any, ...], count: Callable[[], int]) -> int:
    """``count()``, kept by ``key``: a message is counted again at every turn."""
    found = _cache.get(key)  # one lookup: another thread may evict meanwhile
    if found is None:
        found = _cache[key] = count()
        if len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return found


def _image_tokens(head: bytes | None) -> int:
    size = None if head is None else _image_size(head)
    if size is None:
        return TOKENS_PER_UNSIZED_IMAGE
    width, height = size
    fit = min(1.0, 2048 / max(width, height))
    fit *= min(1.0, 768 / (min(width, height) * fit))
    tiles = math.ceil(width * fit / 512) * math.ceil(height * fit / 512)
    shrink = min(1.0, 1568 / max(width, height), math.sqrt(1_150_000 / (width * height)))
    return max(170 * tiles + 85, math.ceil(width * height * shrink * shrink / 750))


def _image_size(head: bytes) -> tuple[int, int] | None:
    """An image's width and height from the start of its data, if readable.

    Sizes come from untrusted bytes: only whole numbers of pixels up to
    :data:`MAX_IMAGE_SIDE` count (an SVG's are floats, ``inf`` included).
    """
    try:
        width, height = imagesize.get(io.BytesIO(head))
    except Exception:  # not an image imagesize knows: charged as unsized
        return None
    sides = (width, height)
    if all(type(side) is int and 0 < side <= MAX_IMAGE_SIDE for side in sides):
        return width, height
    return None


def _is_text(block: dict[str, Any], key: str) -> bool:
    return isinstance(block.get(key), str)


def _inline_text(block: dict[str, Any]) -> str | None:
    """The text of a document given as text, in the shapes that give one."""
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "text":  # Anthropic
        return str(source.get("data") or "")
    if block.get("source_type") == "text" or block.get("type") == "text-plain":
        text = block.get("text")  # LangChain's standard blocks (v0; v1 may give base64)
        return text if isinstance(text, str) else None
    document = block.get("document")
    source = document.get("source") if isinstance(document, dict) else None
    if "type" not in block and isinstance(source, dict):  # Bedrock Converse
        if isinstance(source.get("text"), str):
            return str(source["text"])
        if isinstance(source.get("content"), list):
            parts = [part.get("text") for part in source["content"] if isinstance(part, dict)]
            return "\n".join(part for part in parts if isinstance(part, str))
    return None


def _data_of(block: dict[str, Any]) -> Data | None:
    """A media block's inline data, if it has any (not copied: it may be megabytes)."""
    candidates: list[Any] = []
    source = block.get("source")
    converse = next(
        (block[key] for key in CONVERSE_BLOCKS if isinstance(block.get(key), dict)),
        None,
    )
    if converse is not None and "type" not in block:  # Bedrock Converse
        inner = converse.get("source")
        candidates.append(inner.get("bytes") if isinstance(inner, dict) else None)
    elif isinstance(source, dict):  # Anthropic
        candidates.append(source.get("data") if source.get("type") == "base64" else None)
    else:
        candidates += [
            block.get(key) for key in ("base64", "data", "file_data", "image_url", "url")
        ]
        inner = block.get(str(block.get("type")))  # OpenAI's {"type": "file", "file": {...}}
        if isinstance(inner, dict):
            candidates += [inner.get("data"), inner.get("file_data"), inner.get("url")]
    for value in candidates:
        if isinstance(value, dict):  # {"image_url": {"url": ...}}
            value = value.get("url")
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
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


def _key(data: Data) -> tuple[int, ...]:
    """What the cache keeps a count by: the whole data's hash and length.

    A count reads the whole data (a text file's text, a PDF's pages, a recording's
    length), so two files alike at both ends are two keys. ``str`` and ``bytes``
    keep their own hash: a message counted again costs no rehash.
    """
    if isinstance(data, bytes):
        return hash(data), len(data)
    text, start = data
    return hash(text), len(text), start


def _head(data: Data) -> bytes | None:
    """The first bytes of the data (about :data:`HEAD_CHARS` of base64)."""
    if isinstance(data, bytes):
        return data[:HEAD_CHARS]
    text, start = data
    head = "".join(text[start : start + HEAD_CHARS].split())  # wrapped at 76 columns
    return _b64(head[: len(head) - len(head) % 4])


def _decode(data: Data) -> bytes | None:
    if isinstance(data, bytes):
        return data
    text, start = data
    encoded = "".join(text[start:].split())  # wrapped at 76 columns, as MIME does
    return _b64(encoded[: len(encoded) - len(encoded) % 4])


def _b64(text: str) -> bytes | None:
    try:
        return base64.b64decode(text)
    except (binascii.Error, ValueError):  # not base64 (or not ASCII)
        return None


def _read(
    kind: str,
    raw: bytes | None,
    text_tokens: Callable[[str], int],
    raw_rate: int | None = None,
) -> int:
    """The tokens of media ``raw`` of kind ``kind`` (see :func:`media_tokens`).

    ``raw_rate``: the bytes a second of audio without a header, when known.
    """
    if raw is None:
        return TOKENS_PER_UNREAD_MEDIA
    if kind in ("audio", "video"):
        audio = kind == "audio"
        seconds = _seconds(raw, audio)
        if seconds is not None and audio:
            seconds = max(seconds, len(raw) / MAX_AUDIO_BYTES_PER_SECOND)
        if seconds is None:
            rate = raw_rate or (AUDIO_BYTES_PER_SECOND if audio else VIDEO_BYTES_PER_SECOND)
            seconds = len(raw) / rate
        per_second = TOKENS_PER_AUDIO_SECOND if audio else TOKENS_PER_VIDEO_SECOND
        return max(1, math.ceil(min(seconds, len(raw) / MIN_BYTES_PER_SECOND) * per_second))
    at = raw.find(b"%PDF-", 0, PDF_HEADER_WITHIN)
    if at >= 0:
        pages = _pdf_pages(raw[at:])
        if pages is not None:
            return min(pages, len(raw) // MIN_BYTES_PER_PAGE + 1) * TOKENS_PER_PDF_PAGE
    text = _text_of(raw)
    if text is not None:
        return max(text_tokens(text), math.ceil(len(raw) / MAX_BYTES_PER_TOKEN))
    if raw[:4] == b"PK\x03\x04":  # an office file (docx, xlsx, pptx): its text, not its pictures
        text = _untrusted(lambda: _zip_text(raw))
        if text is not None:
            return max(1, text_tokens(text))
    return math.ceil(len(raw) / BYTES_PER_TOKEN)


def _zip_text(raw: bytes) -> str | None:
    """The text of a zip's text members, without their markup, if it has few members."""
    end = raw.rfind(b"PK\x05\x06", max(0, len(raw) - 65_557))
    if end < 0 or int.from_bytes(raw[end + 10 : end + 12], "little") > ZIP_MAX_MEMBERS:
        return None  # no directory, or too many members to list (0xFFFF: a zip64 one)
    budget = len(raw) * ZIP_MAX_RATIO
    parts: list[str] = []
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        for member in archive.infolist():
            if budget <= 0 or not member.filename.lower().endswith(ZIP_TEXT):
                continue
            with archive.open(member) as stream:
                data = stream.read(budget)
            budget -= len(data)
            parts.append(data.decode("utf-8", "replace"))
    return _TAGS.sub(" ", " ".join(parts))


def _text_of(raw: bytes) -> str | None:
    """A text file's text: UTF-8, UTF-16 with its mark, or GB18030 (Chinese Windows)."""
    marked = raw[:2] in (b"\xff\xfe", b"\xfe\xff")
    for encoding in ("utf-16",) if marked else ("utf-8", "gb18030"):
        try:
            text = raw.decode(encoding)
        except UnicodeDecodeError:
            continue
        start = text[:4096]
        if sum(not (c.isprintable() or c.isspace()) for c in start) <= len(start) // 100:
            return text  # not binary data that happens to decode
    return None


def _seconds(raw: bytes, audio: bool) -> float | None:
    """The length of a recording, from its header, if it can be read.

    A WAV file is read here (a stream's may say its data never ends); other formats
    with ``mutagen``, its tags skipped (an ID3 frame may inflate to gigabytes).
    Audio lasts at least its bytes at its own bit rate: files joined end to end
    keep the first one's header.
    """
    if raw[:4] == b"RIFF" and raw[8:12] == b"WAVE":
        return _wav_seconds(raw)
    found = _untrusted(lambda: _mutagen_info(_without_id3(raw)))
    if found is None:
        return None
    length, bitrate = found
    if audio and bitrate > 0:
        length = max(length, len(raw) * 8 / bitrate)
    return length if math.isfinite(length) and length > 0 else None


def _wav_seconds(raw: bytes) -> float | None:
    """A WAV file's length, if its header can be read.

    PCM by its sample rate and block size, as players read it; a compressed one
    (ADPCM, GSM, MP3 in WAV) by its sample count or its byte rate.
    """
    pcm, rate, byte_rate, samples = True, 0, 0, 0
    at = 12
    for _ in range(WAV_CHUNKS):
        if at + 8 > len(raw):
            break
        name, size = raw[at : at + 4], int.from_bytes(raw[at + 4 : at + 8], "little")
        body = at + 8
        if name == b"fmt " and size >= 16:
            pcm = int.from_bytes(raw[body : body + 2], "little") in WAV_PCM
            rate = int.from_bytes(raw[body + 4 : body + 8], "little")
            byte_rate = int.from_bytes(raw[body + 8 : body + 12], "little")
            if pcm:  # the header's own byte rate is not what players go by
                byte_rate = rate * int.from_bytes(raw[body + 12 : body + 14], "little")
        elif name == b"fact" and size >= 4:
            samples = int.from_bytes(raw[body : body + 4], "little")
        elif name == b"data":
            # A stream written to a pipe says 0 or 0xFFFFFFFF: its data runs to the end.
            held = len(raw) - body
            data = held if size in (0, 0xFFFFFFFF) else min(size, held)
            seconds = data / byte_rate if byte_rate else 0.0
            if not pcm and rate and samples and size == data:  # all of it is here
                seconds = max(seconds, samples / rate)
            return seconds or None
        at = body + size + (size & 1)
    return None


def _without_id3(raw: bytes) -> bytes:
    """``raw`` without the ID3v2 tags it starts with."""
    at = 0
    while raw[at : at + 3] == b"ID3" and len(raw) >= at + 10:
        size = 0
        for byte in raw[at + 6 : at + 10]:  # a "syncsafe" integer: 7 bits a byte
            size = size << 7 | (byte & 0x7F)
        at += 10 + size + (10 if raw[at + 5] & 0x10 else 0)  # and its footer
    return raw[at:]


def _mutagen_info(raw: bytes) -> tuple[float, int] | None:
    # Imported when media is first counted: most turns have none.
    from mutagen import File
    from mutagen.aac import AAC
    from mutagen.ac3 import AC3
    from mutagen.asf import ASF
    from mutagen.flac import FLAC
    from mutagen.monkeysaudio import MonkeysAudio
    from mutagen.mp3 import MP3
    from mutagen.mp4 import MP4
    from mutagen.musepack import Musepack
    from mutagen.oggflac import OggFLAC
    from mutagen.oggopus import OggOpus
    from mutagen.oggspeex import OggSpeex
    from mutagen.oggtheora import OggTheora
    from mutagen.oggvorbis import OggVorbis
    from mutagen.optimfrog import OptimFROG
    from mutagen.wavpack import WavPack

    # Formats whose tags hold no compressed or pointed-to ID3 (AIFF, DSF and WAVE do).
    kinds = [MP3, MP4, OggVorbis, OggOpus, OggFLAC, OggSpeex, OggTheora, FLAC, ASF, AAC]
    kinds += [AC3, WavPack, Musepack, MonkeysAudio, OptimFROG]
    found = File(io.BytesIO(raw), options=kinds)
    if found is None:
        return None
    return float(found.info.length), int(getattr(found.info, "bitrate", 0) or 0)


def _pdf_pages(raw: bytes) -> int | None:
    """The pages a PDF's page tree says it has (``/Count``), if it can be read."""

    def count() -> int:
        import pypdf  # imported when a PDF is first counted

        reader = pypdf.PdfReader(io.BytesIO(raw), strict=False)
        root: Any = reader.trailer["/Root"]  # untyped: any PDF object
        return int(root["/Pages"]["/Count"])

    return _untrusted(count)


def _untrusted(read: Callable[[], Any]) -> Any:
    """What ``read`` finds in untrusted bytes, or ``None`` if it fails or finds nothing > 0."""
    try:
        value = read()
    except Exception:  # a malformed or unknown file: not known
        return None
    if isinstance(value, int) and value <= 0:
        return None
    return value
