"""Standard Webhooks signatures and the URL rules, without servers."""

from __future__ import annotations

import time

import pytest
from openai import OpenAI

from yue2_jobs.errors import InvalidRequestError
from yue2_jobs.webhooks.signing import SignatureError, headers, new_secret, verify
from yue2_jobs.webhooks.targets import check_url, internal

BODY = b'{"id":"evt_1","object":"event","type":"batch.completed","data":{"id":"batch_1"}}'


def test_a_signature_verifies_and_any_change_breaks_it() -> None:
    secret = new_secret()
    h = headers(secret, msg_id="evt_1", body=BODY)
    assert verify(secret, h, BODY) == "evt_1"
    with pytest.raises(SignatureError):
        verify(secret, h, BODY + b" ")
    with pytest.raises(SignatureError):
        verify(new_secret(), h, BODY)
    with pytest.raises(SignatureError):
        verify(secret, {**h, "webhook-id": "evt_2"}, BODY)
    old = headers(secret, msg_id="evt_1", body=BODY, timestamp=int(time.time()) - 3600)
    with pytest.raises(SignatureError, match="tolerance"):
        verify(secret, old, BODY)
    with pytest.raises(SignatureError, match="missing"):
        verify(secret, {}, BODY)


def test_the_openai_client_accepts_our_signature() -> None:
    # Its verifier is the Standard Webhooks one OpenAI's own webhooks use.
    secret = new_secret()
    client = OpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1")
    client.webhooks.verify_signature(BODY, headers(secret, msg_id="evt_1", body=BODY), secret=secret)
    event = client.webhooks.unwrap(BODY, headers(secret, msg_id="evt_1", body=BODY), secret=secret)
    assert event.type == "batch.completed" and event.data.id == "batch_1"


@pytest.mark.parametrize(("address", "refused"), [
    ("127.0.0.1", True), ("10.0.0.8", True), ("172.16.3.4", True), ("192.168.1.1", True),
    ("169.254.169.254", True), ("::1", True), ("fe80::1", True), ("fd00::1", True), ("0.0.0.0", True),
    ("::ffff:127.0.0.1", True), ("100.64.0.1", True), ("8.8.8.8", False), ("2606:4700:4700::1111", False),
    # IPv6 addresses that carry an internal IPv4 one: 6to4 (2002::/16), Teredo, NAT64, IPv4-compatible.
    ("2002:7f00:1::", True), ("2002:a9fe:a9fe::1", True), ("2002:c0a8:101::", True),
    ("2001:0:4136:e378:8000:63bf:3fff:fdd2", True), ("64:ff9b::7f00:1", True), ("64:ff9b:1::a00:1", True),
    ("::127.0.0.1", True), ("::ffff:8.8.8.8", False),
])
def test_internal_addresses(address: str, refused: bool) -> None:
    assert internal(address) is refused


def test_loopback_is_allowed_only_when_the_operator_says_so() -> None:
    with pytest.raises(InvalidRequestError, match=r"127\.0\.0\.1"):
        check_url("http://127.0.0.1:8080/hook", allow_private=False)
    assert check_url("http://127.0.0.1:8080/hook", allow_private=True) == "http://127.0.0.1:8080/hook"
    with pytest.raises(InvalidRequestError, match="does not resolve"):
        check_url("http://no-such-host.invalid/hook", allow_private=True)
    with pytest.raises(InvalidRequestError, match="scheme"):
        check_url("file:///etc/passwd", allow_private=True)


def test_a_6to4_address_around_loopback_is_internal() -> None:
    # A name may resolve to it; as a literal, an IPv6 address is refused by the URL's shape already.
    assert internal("2002:7f00:1::")
    with pytest.raises(InvalidRequestError, match="IPv6 literals are not supported"):
        check_url("http://[2002:7f00:1::]/hook", allow_private=True)  # nothing is resolved
