"""The resource cache: serialize once, versions that move only on change, Views shared."""

from __future__ import annotations

from testkit.builders import load, service
from testkit.xds_model import CDS, EDS, World, ips, name, unpack

WEB, API = name("web"), name("api")


def test_one_change_on_a_view_watched_by_many_streams_is_encoded_once() -> None:
    world = World()
    sotw = [world.sotw() for _ in range(200)]
    delta = [world.delta() for _ in range(50)]
    for c in sotw:
        c.request(EDS, [WEB])
    for d in delta:
        d.request(EDS, [WEB])
    before = world.count("meshbridge_xds_serializations_total", type="eds")
    first = [c.one(EDS) for c in sotw] + [d.one(EDS) for d in delta]
    assert world.count("meshbridge_xds_serializations_total", type="eds") == before + 1
    assert len(world.views.views()) == 1  # one View, 250 subscribers
    assert sum(world.views.views()[0].subscriber_counts().values()) == 250
    for c in sotw:
        c.ack(EDS, [WEB])
    for d in delta:
        d.ack(EDS)
    world.set_endpoints("web", ["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    pushed_sotw = [c.one(EDS) for c in sotw]
    pushed_delta = [d.one(EDS) for d in delta]
    assert world.count("meshbridge_xds_serializations_total", type="eds") == before + 2
    bodies = {r.resources[0].value for r in pushed_sotw}
    bodies |= {r.resources[0].resource.value for r in pushed_delta}
    assert len(bodies) == 1
    assert ips(unpack(pushed_sotw[0].resources[0])) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert len({r.nonce for r in first}) >= 1


def test_the_cds_version_moves_only_when_a_cluster_changes() -> None:
    world = World()
    before = world.cache.version(CDS)
    world.set_endpoints("web", ["10.0.0.9"])  # endpoints are not clusters
    load(world.cluster, service("web", ports=[{"name": "http", "port": 80,
                                              "targetPort": 8080}]))  # the same again
    assert world.cache.version(CDS) == before
    world.set_port_protocol("web", "grpc")
    assert world.cache.version(CDS) != before


def test_every_service_port_is_a_cluster_except_external_names() -> None:
    world = World()
    load(world.cluster,
         service("multi", ports=[{"name": "http", "port": 80}, {"name": "grpc", "port": 81},
                                 {"name": "dns", "port": 53, "protocol": "UDP"}]),
         service("mail", type="ExternalName", externalName="smtp.example.com",
                 ports=[{"name": "smtp", "port": 25}]))
    assert world.cache.port_names() == sorted(
        [API, WEB, name("multi", 80), name("multi", 81), name("multi", 53)])


def test_a_port_served_over_tcp_and_udp_is_one_cluster() -> None:
    # Core fix: the decoder refused the whole Service (kube-dns is one).
    world = World()
    load(world.cluster, service("dns", ports=[
        {"name": "dns", "port": 53, "protocol": "UDP"},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
        {"name": "metrics", "port": 9153}]))
    assert name("dns", 53) in world.cache.port_names()
    assert name("dns", 9153) in world.cache.port_names()


def test_an_external_name_service_has_an_empty_cla_until_it_changes_type() -> None:
    world = World()
    load(world.cluster, service("mail", type="ExternalName", externalName="smtp.example.com"))
    client = world.sotw()
    client.request(EDS, [name("mail")])
    assert ips(unpack(client.one(EDS).resources[0])) == []
    client.ack(EDS, [name("mail")])
    # It becomes an ordinary service with endpoints: the blocked watch is retried.
    world.add_service("mail", ["10.0.5.5"])
    assert ips(unpack(client.one(EDS).resources[0])) == ["10.0.5.5"]
    client.stream.close()
    assert world.views.views() == [] and not world.cache.endpoints._blocked


def test_streams_sharing_a_view_with_linkerd_subscribers_see_the_same_version() -> None:
    world = World()
    client = world.sotw()
    client.request(EDS, [WEB])
    client.responses()
    view = world.views.views()[0]
    res = world.cache.cla_of(view)
    assert res is world.cache.get(EDS, WEB)  # cached per View version
    world.set_endpoints("web", ["10.0.0.4"])
    assert world.cache.get(EDS, WEB) is not res


def test_sotw_versions_are_per_type_and_derived_from_content() -> None:
    a, b = World(), World()
    got = []
    for world in (a, b):
        client = world.sotw()
        client.request(CDS, [])
        client.request(EDS, [WEB])
        got.append([r.version_info for r in client.responses()])
    # xDS §1.2: CDS and EDS each have their own; two servers with one truth agree.
    assert got[0] == got[1] and len(set(got[0])) == 2
