"""The checkpoint set of a renaissance.torch optimizer with several Tasks (docs/python.md,
"save and load"): one core checkpoint per Task (`path.task0`, `path.task1`, ...) and, at `path`,
a manifest naming the files and a digest of each, written last. save() writes every Task's file
to a temporary first and replaces the set only when all were written; load() checks the manifest
against the files and this optimizer before it loads anything, so a set that a failed save left
mixed or incomplete is refused instead of loading half of it.

A file's digest covers its header and every section's framing and XXH3-64 checksum
(docs/checkpoint-format.md): the core's load verifies each checksum against its payload, so a
file with this digest holds the content the save wrote, without hashing the whole file here.
"""
import hashlib
import json
import os
import struct

_CKPT_MAGIC = b"\x89RNCKPT\n"  # the core checkpoint's first 8 bytes
FORMAT = "renaissance.torch checkpoint set"
_MAX_SECTIONS = 64  # far more than any version writes; a larger count is not a checkpoint


def digest(path):
    """-> hex digest of checkpoint file `path` (header, then each section's tag, length and
    checksum); a ValueError naming the file when it is not a complete checkpoint."""
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) != 24 or head[:8] != _CKPT_MAGIC:
            raise ValueError("%s: not a Renaissance checkpoint" % path)
        (count,) = struct.unpack_from("<I", head, 12)
        if count > _MAX_SECTIONS:
            raise ValueError("%s: not a Renaissance checkpoint (%d sections)" % (path, count))
        h = hashlib.sha256(head)
        size = os.fstat(f.fileno()).st_size
        for _ in range(count):
            frame = f.read(12)
            if len(frame) != 12:
                raise ValueError("%s: truncated checkpoint" % path)
            (length,) = struct.unpack_from("<Q", frame, 4)
            if f.tell() + length + 8 > size:
                raise ValueError("%s: truncated checkpoint" % path)
            f.seek(length, os.SEEK_CUR)
            h.update(frame + f.read(8))
        if f.tell() != size:
            raise ValueError("%s: bytes after the last section" % path)
    return h.hexdigest()


def describe(shared):
    """What a Task's checkpoint must fit: its kind, precision, groups, parameter shapes (a
    complex parameter: its real view's, as the arena holds it) and roles (LARS's and LAMB's
    trust_ratio)."""
    return {"kind": shared.kind, "precision": shared.precision, "groups": len(shared.bindings),
            "shapes": [list(p.shape) + ([2] if p.is_complex() else []) for p in shared.params],
            "roles": [r for b in shared.bindings for r in b.roles]}


def is_manifest(path):
    """Whether `path` starts as a manifest does (a single Task's load then names the mix-up)."""
    try:
        with open(path, "rb") as f:
            return FORMAT.encode() in f.read(128)
    except OSError:
        return False


def write_manifest(path, files, tasks):
    """Writes the manifest atomically: a temporary beside it, fsync, rename over `path`, fsync of
    the folder (as the core writes its checkpoints)."""
    entries = [dict(describe(t), file=os.path.basename(f), digest=digest(f)) for f, t in zip(files, tasks)]
    text = json.dumps({"format": FORMAT, "version": 1, "tasks": entries}, indent=1) + "\n"
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise
    fsync_folder(path)


def check(path, files, tasks, cls):
    """Refuses (ValueError, FileNotFoundError) a set that does not match its manifest or this
    optimizer's Tasks; reads only, changes nothing."""
    where = "%s.load(%r)" % (cls, path)
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 20)
    except FileNotFoundError:
        raise FileNotFoundError("%s: no manifest at %r; an optimizer with %d Tasks is saved as a set (%s, ...) that "
                                "save() names in a manifest at the path, written last: without it the set is "
                                "incomplete" % (where, path, len(tasks), files[0])) from None
    if raw.startswith(_CKPT_MAGIC):
        raise ValueError("%s: %r holds the checkpoint of one Task; this optimizer has %d Tasks (another grouping "
                         "of the parameters, dtypes or settings)" % (where, path, len(tasks)))
    try:
        manifest = json.loads(raw.decode("utf-8"))
        entries = manifest["tasks"]
        ok = manifest.get("format") == FORMAT and manifest.get("version") == 1 and isinstance(entries, list)
    except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise ValueError("%s: %r is not a checkpoint set's manifest" % (where, path))
    if len(entries) != len(tasks):
        raise ValueError("%s: the set holds %d Tasks; this optimizer has %d" % (where, len(entries), len(tasks)))
    for i, (entry, f, t) in enumerate(zip(entries, files, tasks)):
        if not isinstance(entry, dict) or entry.get("file") != os.path.basename(f):
            raise ValueError("%s: the manifest's Task %d is not %r" % (where, i, os.path.basename(f)))
        mine = describe(t)
        for key in ("kind", "precision", "groups", "shapes", "roles"):
            if entry.get(key) != mine[key]:
                raise ValueError("%s: Task %d of the set was saved with %s %r; this optimizer's Task %d has %r" %
                                 (where, i, key, entry.get(key), i, mine[key]))
    for i, (entry, f) in enumerate(zip(entries, files)):
        try:
            found = digest(f)
        except FileNotFoundError:
            raise FileNotFoundError("%s: %r, Task %d of the set, is missing: the set is incomplete (a save that "
                                    "failed part-way?); nothing was loaded" % (where, f, i)) from None
        if found != entry.get("digest"):
            raise ValueError("%s: %r is not the file the manifest names for Task %d: the set is mixed (a save that "
                             "failed part-way?); nothing was loaded" % (where, f, i))


def remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass


def fsync_folder(path):
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
