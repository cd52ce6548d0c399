"""A View's ClusterLoadAssignment kept assembled across versions, so that a change
costs what changed, not what is there (issue 16).

SotW and delta EDS both send the whole CLA on every change (the protocol), but its
bytes need not be rebuilt: a protobuf message is the concatenation of its fields, so
the CLA is its name, then per locality a tag and length, the Locality, every
LbEndpoint's cached field bytes in address order, and the weight. A `ClaAssembly`
keeps, per locality, the endpoints in address order in blocks of those field bytes,
each block joined once; a change re-encodes only the endpoints it names, moves them
in or out of their blocks (`bisect`) and joins those blocks again; the CLA is the
sequence of its blocks, which each stream's response joins into itself (one C-level
`b"".join`, a few large contiguous copies), so the whole CLA is never copied but
into the responses.

The resource version is a content hash too, but of a digest kept in step: each
endpoint's field bytes are hashed once when encoded, and a locality's digest is the
sum of its members' (mod 2**128), moved by the change alone. The version is the hash
of the name and each locality's (Locality, weight, digest): equal CLAs get equal
versions whichever way they were assembled, and hashing it costs the localities, not
the endpoints.

The assembly follows the View through its `ViewChange`s (`apply`); one that missed a
version is rebuilt from the snapshot (`rebuild`), reusing every endpoint whose
encoding still holds. The result is byte for byte what `resources.encode_cla` makes.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from google.protobuf import any_pb2

from bridge.model import EndpointId, ResolvedEndpoint
from xds_api import resource_types as rt
from xds_api import wire
from xds_api.resources import (
    UINT32_MAX,
    EncodedEndpoint,
    EncodedResource,
    Locality,
    MetadataEncoder,
    SortKey,
    encode_endpoint,
    locality_field,
    wrap_resource,
)

_DIGEST_MASK = (1 << 128) - 1
_ANY_TYPE_URL = wire.field_number(any_pb2.Any.DESCRIPTOR, "type_url")
_ANY_VALUE = wire.field_number(any_pb2.Any.DESCRIPTOR, "value")
_CLA_NAME = wire.field_number(endpoint_pb2.ClusterLoadAssignment.DESCRIPTOR, "cluster_name")
_CLA_ENDPOINTS = wire.field_number(endpoint_pb2.ClusterLoadAssignment.DESCRIPTOR, "endpoints")
_LOC_WEIGHT = wire.field_number(endpoint_components_pb2.LocalityLbEndpoints.DESCRIPTOR,
                                "load_balancing_weight")
_ANY_HEAD = wire.string_field(_ANY_TYPE_URL, rt.ENDPOINT)


def _winner_key(enc: EncodedEndpoint) -> tuple[bool, bool, EndpointId]:
    # Of two endpoints at one address, the ready one wins, then the pod (it carries
    # the enrichment), then the first by id: never the order they arrived in.
    eid = enc.source.id
    return (not enc.ready, eid.kind != "pod", eid)


# Endpoints per block of a locality: a change re-joins one block, and the CLA is
# joined from the blocks' bytes (a few large, contiguous copies rather than one small
# copy per endpoint scattered over the heap, which costs a cache miss each).
BLOCK = 64


class _Block:
    __slots__ = ("chunks", "joined", "keys", "members")

    def __init__(self, members: list[EncodedEndpoint]) -> None:
        self.members = members
        self.keys = [m.sort_key for m in members]
        self.chunks = [m.field for m in members]
        self.joined: bytes | None = None

    def data(self) -> bytes:
        if self.joined is None:
            self.joined = b"".join(self.chunks)
        return self.joined


@dataclass(slots=True, eq=False)
class LocalityRun:
    """One locality's endpoints in address order, in blocks of about `BLOCK`, with
    what its header needs."""

    header: bytes  # the LocalityLbEndpoints.locality field
    blocks: list[_Block] = field(default_factory=list)
    lasts: list[SortKey] = field(default_factory=list)  # each block's last key
    count: int = 0
    size: int = 0  # bytes of all members' lb_endpoints fields
    weight: int = 0
    digest: int = 0

    @classmethod
    def of(cls, header: bytes, members: list[EncodedEndpoint]) -> LocalityRun:
        """A run of `members`, already in address order."""
        run = cls(header)
        for i in range(0, len(members), BLOCK):
            block = _Block(members[i:i + BLOCK])
            run.blocks.append(block)
            run.lasts.append(block.keys[-1])
        run.count = len(members)
        run.size = sum(len(m.field) for m in members)
        run.weight = sum(m.weight for m in members)
        run.digest = sum(m.digest for m in members) & _DIGEST_MASK
        return run

    def members(self) -> list[EncodedEndpoint]:
        return [m for block in self.blocks for m in block.members]

    def chunks(self) -> list[bytes]:
        return [block.data() for block in self.blocks]

    def insert(self, enc: EncodedEndpoint) -> None:
        key = enc.sort_key
        if not self.blocks:
            self.blocks.append(_Block([enc]))
            self.lasts.append(key)
        else:
            b = min(bisect_left(self.lasts, key), len(self.blocks) - 1)
            block = self.blocks[b]
            i = bisect_left(block.keys, key)
            block.keys.insert(i, key)
            block.members.insert(i, enc)
            block.chunks.insert(i, enc.field)
            block.joined = None
            self.lasts[b] = block.keys[-1]
            if len(block.members) > 2 * BLOCK:
                tail = _Block(block.members[BLOCK:])
                del block.members[BLOCK:], block.keys[BLOCK:], block.chunks[BLOCK:]
                self.lasts[b] = block.keys[-1]
                self.blocks.insert(b + 1, tail)
                self.lasts.insert(b + 1, tail.keys[-1])
        self.count += 1
        self.size += len(enc.field)
        self.weight += enc.weight
        self.digest = (self.digest + enc.digest) & _DIGEST_MASK

    def remove(self, enc: EncodedEndpoint) -> None:
        b = bisect_left(self.lasts, enc.sort_key)
        block = self.blocks[b]
        i = bisect_left(block.keys, enc.sort_key)
        assert block.members[i] is enc
        del block.keys[i], block.members[i], block.chunks[i]
        block.joined = None
        if block.keys:
            self.lasts[b] = block.keys[-1]
        else:
            del self.blocks[b], self.lasts[b]
        self.count -= 1
        self.size -= len(enc.field)
        self.weight -= enc.weight
        self.digest = (self.digest - enc.digest) & _DIGEST_MASK


class ClaAssembly:
    """One View's CLA, assembled from cached per-endpoint bytes; see the module."""

    __slots__ = ("_by_addr", "_chosen", "draining", "entries", "metadata", "moves",
                 "rekey", "runs", "version")

    def __init__(self, draining: bool, metadata: MetadataEncoder) -> None:
        self.draining = draining
        self.metadata = metadata
        self.version = -1  # the View version this reflects; -1: none yet
        # Every endpoint the CLA may carry, encoded (None health ones are left out).
        self.entries: dict[EndpointId, EncodedEndpoint] = {}
        self._by_addr: dict[SortKey, set[EndpointId]] = {}
        self._chosen: dict[SortKey, EncodedEndpoint] = {}  # the one sent per address
        self.runs: dict[Locality, LocalityRun] = {}
        # Endpoints whose metadata may have changed without the endpoint (pod labels,
        # read by the istio profile): looked at again on the next change.
        self.rekey: set[EndpointId] = set()
        # What the last `apply` did to the CLA's endpoints, (before, after) per address
        # whose endpoint changed, for LEDS to follow; None after a `rebuild`.
        self.moves: list[tuple[EncodedEndpoint | None, EncodedEndpoint | None]] | None = None

    # ------------------------------------------------------------- following

    def rebuild(self, endpoints: Iterable[ResolvedEndpoint], version: int) -> None:
        """Everything again from a whole snapshot, reusing what still holds."""
        old = self.entries
        entries: dict[EndpointId, EncodedEndpoint] = {}
        for resolved in endpoints:
            enc = self._encoded(resolved, old.get(resolved.id))
            if enc is not None:
                entries[resolved.id] = enc
        by_addr: dict[SortKey, set[EndpointId]] = {}
        for eid, enc in entries.items():
            by_addr.setdefault(enc.sort_key, set()).add(eid)
        chosen = {a: min((entries[i] for i in ids), key=_winner_key)
                  for a, ids in by_addr.items()}
        grouped: dict[Locality, list[EncodedEndpoint]] = {}
        for a in sorted(chosen):
            enc = chosen[a]
            grouped.setdefault(enc.locality, []).append(enc)
        runs = {loc: LocalityRun.of(locality_field(*loc), members)
                for loc, members in grouped.items()}
        self.entries, self._by_addr, self._chosen, self.runs = entries, by_addr, chosen, runs
        self.rekey.clear()
        self.moves = None
        self.version = version

    def apply(self, added: Iterable[ResolvedEndpoint], removed: Iterable[ResolvedEndpoint],
              current: Mapping[EndpointId, ResolvedEndpoint], version: int) -> None:
        """One View change: `added` (new or changed) and `removed` endpoints, against
        the version this assembly reflects (`version - 1`)."""
        touched: set[SortKey] = set()
        self.moves = []
        for r in removed:
            self._drop(r.id, touched)
        changed = {r.id: r for r in added}
        if self.rekey:
            for eid in self.rekey:
                if eid not in changed and (r2 := current.get(eid)) is not None:
                    changed[eid] = r2
            self.rekey.clear()
        for eid, r in changed.items():
            old = self.entries.get(eid)
            enc = self._encoded(r, old)
            if enc is old:
                continue
            self._drop(eid, touched)
            if enc is not None:
                self.entries[eid] = enc
                self._by_addr.setdefault(enc.sort_key, set()).add(eid)
                touched.add(enc.sort_key)
        for a in touched:
            self._choose(a)
        self.version = version

    def _encoded(self, r: ResolvedEndpoint, old: EncodedEndpoint | None
                 ) -> EncodedEndpoint | None:
        key = self.metadata.key(r)
        if old is not None and old.source == r and old.metadata_key == key:
            return old
        return encode_endpoint(r, self.draining, self.metadata, key)

    def _drop(self, eid: EndpointId, touched: set[SortKey]) -> None:
        enc = self.entries.pop(eid, None)
        if enc is None:
            return
        ids = self._by_addr.get(enc.sort_key)
        if ids is not None:
            ids.discard(eid)
            if not ids:
                del self._by_addr[enc.sort_key]
        touched.add(enc.sort_key)

    def _choose(self, addr: SortKey) -> None:
        ids = self._by_addr.get(addr)
        new = min((self.entries[i] for i in ids), key=_winner_key) if ids else None
        prev = self._chosen.get(addr)
        if prev is new:
            return
        assert self.moves is not None
        self.moves.append((prev, new))
        if prev is not None:
            old_run = self.runs[prev.locality]
            old_run.remove(prev)
            if not old_run.count:
                del self.runs[prev.locality]
        if new is None:
            del self._chosen[addr]
            return
        self._chosen[addr] = new
        run = self.runs.get(new.locality)
        if run is None:
            run = self.runs[new.locality] = LocalityRun(locality_field(*new.locality))
        run.insert(new)

    # ------------------------------------------------------------- reading

    def localities(self) -> dict[Locality, tuple[EncodedEndpoint, ...]]:
        """The endpoints the CLA carries, by locality, both in order (a copy)."""
        return {loc: tuple(self.runs[loc].members()) for loc in sorted(self.runs)}

    def resource(self, name: str) -> EncodedResource:
        """The CLA as every stream sends it: the cached blocks, in order."""
        parts = [wire.string_field(_CLA_NAME, name)]
        size = len(parts[0])
        digests = [name.encode()]
        for loc in sorted(self.runs):
            run = self.runs[loc]
            weight = min(UINT32_MAX, run.weight)
            wfield = wire.length_delimited(_LOC_WEIGHT, wire.uint_field(1, weight))
            inner = len(run.header) + run.size + len(wfield)
            head = wire.length_delimited_prefix(_CLA_ENDPOINTS, inner)
            parts.append(head)
            parts.append(run.header)
            parts.extend(run.chunks())
            parts.append(wfield)
            size += len(head) + inner
            digests.append(b"%b:%d:%032x" % (run.header, weight, run.digest))
        version = hashlib.sha256(b"\n".join(digests)).hexdigest()[:24]
        value = wire.length_delimited_prefix(_ANY_VALUE, size)
        # Not joined here: each stream's response joins these pieces into itself.
        return wrap_resource(name, version, (_ANY_HEAD, value, *parts),
                             len(_ANY_HEAD) + len(value) + size)
