"""The Kubernetes API's protobuf encoding, as far as meshbridge reads it.

The API server answers `Accept: application/vnd.kubernetes.protobuf` for its built-in
kinds; a 10,000-pod cluster is then about a fifth less to send than its JSON, several
times cheaper for the server to encode and, above all, parsed in C: what meshbridge
does not read (managedFields, volumes, container statuses, a ReplicaSet's pod
template: most of every object) is skipped without becoming a Python object.

The schema below is the API's own field numbers and types for the fields meshbridge
reads, and nothing else: a table, turned into message classes at import (no protoc,
no generated files). Only the kinds the kube source watches are here (Pods, Services,
EndpointSlices, v1 Endpoints; Nodes, ReplicaSets and Jobs for their metadata), the
list and watch envelopes, and the Status of an error. `bridge/sources/kube_wire.py`
turns these messages into the mappings `bridge.objects` decodes.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "meshbridge.kube.v1"

# message -> (field, number, type, repeated). A type is a scalar's name or another
# message of this table. Every field is proto2 `optional` (presence is
# known: an absent `ready` is not a false one) unless repeated.
SCHEMA: dict[str, list[tuple[str, int, str, bool]]] = {
    # Envelopes: a body is the magic "k8s\0" and an Unknown holding the object; a watch
    # stream is length-prefixed WatchEvents whose object is such a body.
    "Unknown": [("typeMeta", 1, "TypeMeta", False), ("raw", 2, "bytes", False),
                ("contentEncoding", 3, "string", False), ("contentType", 4, "string", False)],
    "TypeMeta": [("apiVersion", 1, "string", False), ("kind", 2, "string", False)],
    "WatchEvent": [("type", 1, "string", False), ("object", 2, "RawExtension", False)],
    "RawExtension": [("raw", 1, "bytes", False)],
    "Status": [("status", 2, "string", False), ("message", 3, "string", False),
               ("reason", 4, "string", False), ("code", 6, "int32", False)],
    # Metadata.
    "Time": [("seconds", 1, "int64", False), ("nanos", 2, "int32", False)],
    "OwnerReference": [("kind", 1, "string", False), ("name", 3, "string", False)],
    # Only when a field manager last wrote (the informer-lag metric), not what it wrote.
    "ManagedFieldsEntry": [("operation", 2, "string", False), ("time", 4, "Time", False)],
    # Labels, annotations and owners are kept encoded (a StringEntry each, as a map's
    # entries are encoded; an OwnerReference each): a workload's pods carry equal ones,
    # read once (kube_wire).
    "ObjectMeta": [("name", 1, "string", False), ("namespace", 3, "string", False),
                   ("resourceVersion", 6, "string", False),
                   ("deletionTimestamp", 9, "Time", False), ("labels", 11, "bytes", True),
                   ("annotations", 12, "bytes", True),
                   ("ownerReferences", 13, "bytes", True),
                   ("managedFields", 17, "ManagedFieldsEntry", True)],
    "StringEntry": [("key", 1, "string", False), ("value", 2, "string", False)],
    "ListMeta": [("resourceVersion", 2, "string", False), ("continue", 3, "string", False)],
    # Nodes, ReplicaSets and Jobs: their metadata is all meshbridge reads.
    "MetadataOnly": [("metadata", 1, "ObjectMeta", False)],
    "MetadataOnlyList": [("metadata", 1, "ListMeta", False),
                         ("items", 2, "MetadataOnly", True)],
    "IntOrString": [("type", 1, "int64", False), ("intVal", 2, "int32", False),
                    ("strVal", 3, "string", False)],
    # Pods.
    "EnvVar": [("name", 1, "string", False), ("value", 2, "string", False)],
    "ContainerPort": [("name", 1, "string", False), ("hostPort", 2, "int32", False),
                      ("containerPort", 3, "int32", False)],
    "HTTPGetAction": [("path", 1, "string", False), ("port", 2, "IntOrString", False)],
    "ProbeHandler": [("httpGet", 2, "HTTPGetAction", False)],
    "Probe": [("handler", 1, "ProbeHandler", False)],
    "Container": [("name", 1, "string", False), ("ports", 6, "ContainerPort", True),
                  ("env", 7, "EnvVar", True), ("livenessProbe", 10, "Probe", False),
                  ("readinessProbe", 11, "Probe", False), ("startupProbe", 22, "Probe", False)],
    # A pod's containers are kept encoded (a Container each): a workload's replicas
    # carry byte-identical ones, so each distinct encoding is read once (kube_wire).
    "PodSpec": [("containers", 2, "bytes", True),
                ("serviceAccountName", 8, "string", False), ("nodeName", 10, "string", False),
                ("hostNetwork", 11, "bool", False), ("initContainers", 20, "bytes", True)],
    "PodIP": [("ip", 1, "string", False)],
    "PodStatus": [("phase", 1, "string", False), ("hostIP", 5, "string", False),
                  ("podIP", 6, "string", False), ("podIPs", 12, "PodIP", True)],
    "Pod": [("metadata", 1, "ObjectMeta", False), ("spec", 2, "PodSpec", False),
            ("status", 3, "PodStatus", False)],
    "PodList": [("metadata", 1, "ListMeta", False), ("items", 2, "Pod", True)],
    # Services.
    "ServicePort": [("name", 1, "string", False), ("protocol", 2, "string", False),
                    ("port", 3, "int32", False), ("targetPort", 4, "IntOrString", False),
                    ("appProtocol", 6, "string", False)],
    # The selector (a map, kept encoded as labels are): a linked cluster's watches
    # follow the pods the wanted Services select (bridge/multicluster/remote.py).
    "ServiceSpec": [("ports", 1, "ServicePort", True), ("selector", 2, "bytes", True),
                    ("clusterIP", 3, "string", False),
                    ("type", 4, "string", False), ("externalName", 10, "string", False),
                    ("clusterIPs", 18, "string", True),
                    ("internalTrafficPolicy", 22, "string", False)],
    "Service": [("metadata", 1, "ObjectMeta", False), ("spec", 2, "ServiceSpec", False)],
    "ServiceList": [("metadata", 1, "ListMeta", False), ("items", 2, "Service", True)],
    # EndpointSlices (discovery.k8s.io/v1).
    "ObjectReference": [("kind", 1, "string", False), ("namespace", 2, "string", False),
                        ("name", 3, "string", False)],
    "EndpointConditions": [("ready", 1, "bool", False), ("serving", 2, "bool", False),
                           ("terminating", 3, "bool", False)],
    "ForZone": [("name", 1, "string", False)],
    "EndpointHints": [("forZones", 1, "ForZone", True)],
    "SliceEndpoint": [("addresses", 1, "string", True),
                      ("conditions", 2, "EndpointConditions", False),
                      ("hostname", 3, "string", False),
                      ("targetRef", 4, "ObjectReference", False),
                      ("nodeName", 6, "string", False), ("zone", 7, "string", False),
                      ("hints", 8, "EndpointHints", False)],
    "SlicePort": [("name", 1, "string", False), ("protocol", 2, "string", False),
                  ("port", 3, "int32", False), ("appProtocol", 4, "string", False)],
    "EndpointSlice": [("metadata", 1, "ObjectMeta", False),
                      ("endpoints", 2, "SliceEndpoint", True), ("ports", 3, "SlicePort", True),
                      ("addressType", 4, "string", False)],
    "EndpointSliceList": [("metadata", 1, "ListMeta", False),
                          ("items", 2, "EndpointSlice", True)],
    # v1 Endpoints.
    "EndpointAddress": [("ip", 1, "string", False), ("targetRef", 2, "ObjectReference", False),
                        ("hostname", 3, "string", False), ("nodeName", 4, "string", False)],
    "EndpointPort": [("name", 1, "string", False), ("port", 2, "int32", False),
                     ("protocol", 3, "string", False), ("appProtocol", 4, "string", False)],
    "EndpointSubset": [("addresses", 1, "EndpointAddress", True),
                       ("notReadyAddresses", 2, "EndpointAddress", True),
                       ("ports", 3, "EndpointPort", True)],
    "Endpoints": [("metadata", 1, "ObjectMeta", False),
                  ("subsets", 2, "EndpointSubset", True)],
    "EndpointsList": [("metadata", 1, "ListMeta", False), ("items", 2, "Endpoints", True)],
}

_SCALARS = {
    "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
    "bytes": descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
    "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
    "int32": descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
    "int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
}


def _file() -> descriptor_pb2.FileDescriptorProto:
    F = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="meshbridge/kube.proto",
                                               package=PACKAGE, syntax="proto2")
    for name, fields in SCHEMA.items():
        message = proto.message_type.add(name=name)
        for field, number, kind, repeated in fields:
            f = message.field.add(name=field, number=number,
                                  label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if kind in _SCALARS:
                f.type = _SCALARS[kind]
            else:
                f.type = F.TYPE_MESSAGE
                f.type_name = f".{PACKAGE}.{kind}"
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())
MESSAGES: dict[str, Any] = {
    name: message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{name}"))
    for name in SCHEMA
}
