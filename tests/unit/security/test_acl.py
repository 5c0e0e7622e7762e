"""Tests of `mop.security.acl`: the mosquitto ACL file, `covers`, and EMQX's ACL claims."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mop.security.acl import MAX_CLAIM_RULES, Access, AclError, AclRules, ClaimAcl, covers
from mop.topics import TopicError, matches, validate_topic_filter

READ = Access.READ
WRITE = Access.WRITE
SUBSCRIBE = Access.SUBSCRIBE


def decide_all(rules: AclRules | ClaimAcl, user: str | None, topic: str, client: str = "c1"):
    """The verdicts for READ, WRITE and SUBSCRIBE, in that order."""
    return tuple(rules.decide(user, client, access, topic) for access in (READ, WRITE, SUBSCRIBE))


def parse_error(text: str) -> str:
    with pytest.raises(AclError) as caught:
        AclRules.parse(text)
    message = str(caught.value)
    assert "\n" not in message
    return message


def claim_error(claim: object) -> str:
    with pytest.raises(AclError) as caught:
        ClaimAcl.from_claim(claim)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- covers ------------------------------------------------------------------------------------

COVERS_CASES = [
    ("a/#", "a/+/c", True),
    ("a/#", "a/#", True),
    ("a/#", "a", True),
    ("a/#", "a/b", True),
    ("a/#", "b/#", False),
    ("a/#", "#", False),
    ("a/+", "a/#", False),
    ("a/+", "a/b", True),
    ("a/+", "a/+", True),
    ("a/+", "a", False),
    ("a/+", "a/b/c", False),
    ("a/b", "a/+", False),
    ("a/b", "a/b", True),
    ("a/b", "a/b/c", False),
    ("a", "a/#", False),
    ("#", "a/#", True),
    ("#", "#", True),
    ("#", "+/x", True),
    ("#", "$SYS/#", False),
    ("#", "$SYS", False),
    ("+/#", "$SYS/x", False),
    ("+/x", "$SYS/x", False),
    ("$SYS/#", "$SYS/broker/+", True),
    ("$SYS/#", "#", False),
    ("+/#", "#", True),
    ("/+/#", "/#", True),
    ("+/+/#", "/#", True),
    ("+/+/#", "a/#", False),
    ("/+/+/#", "/#", False),
    ("+/+/#", "#", False),
    ("a/+/#", "a/#", False),
    ("a/+/#", "a/+/#", True),
    ("+", "", True),
    ("+/+", "/", True),
]


@pytest.mark.parametrize(("rule", "sub", "expected"), COVERS_CASES)
def test_covers_examples(rule: str, sub: str, expected: bool) -> None:
    assert covers(rule, sub) is expected


# Every filter of up to three levels over these, with or without a trailing '#'.
FILTER_LEVELS = ["a", "$s", "", "+"]
# Topic levels: the filters' literals, another plain level and another `$` level stand for any.
TOPIC_LEVELS = ["a", "b", "$s", "$t", ""]


def small_filters() -> list[str]:
    found = []
    for count in range(1, 4):
        for levels in itertools.product(FILTER_LEVELS, repeat=count):
            found.append("/".join(levels))
        for levels in itertools.product(FILTER_LEVELS, repeat=count - 1):
            found.append("/".join((*levels, "#")))
    valid = []
    for topic_filter in found:
        try:
            validate_topic_filter(topic_filter)
        except TopicError:
            continue
        valid.append(topic_filter)
    return valid


def small_topics() -> list[str]:
    found = []
    # One level deeper than any filter, so that a trailing '#' is told apart from '+'.
    for count in range(1, 5):
        found.extend("/".join(levels) for levels in itertools.product(TOPIC_LEVELS, repeat=count))
    return [topic for topic in found if topic]


def test_covers_is_exact_on_small_filters() -> None:
    """covers(r, f) holds exactly when the topics f matches are a subset of those r matches."""
    filters = small_filters()
    topics = small_topics()
    assert len(filters) > 90
    matched = {f: frozenset(t for t in topics if matches(f, t)) for f in filters}
    mismatches = [
        (rule, sub)
        for rule in filters
        for sub in filters
        if covers(rule, sub) != (matched[sub] <= matched[rule])
    ]
    assert mismatches == []


level = st.sampled_from(["a", "b", "$SYS", "", "+"])
filters = st.one_of(
    st.just("#"),
    st.lists(level, min_size=1, max_size=4).map("/".join),
    st.lists(level, min_size=0, max_size=3).map(lambda levels: "/".join([*levels, "#"])),
).filter(lambda f: f != "")
topic_names = (
    st.lists(st.sampled_from(["a", "b", "c", "$SYS", ""]), min_size=1, max_size=6)
    .map("/".join)
    .filter(lambda t: t != "")
)


@settings(max_examples=500)
@given(filters, filters, st.lists(topic_names, min_size=1, max_size=20))
def test_covers_implies_every_matched_topic_is_matched_by_the_rule(
    rule: str, sub: str, topics: list[str]
) -> None:
    if covers(rule, sub):
        for topic in topics:
            if matches(sub, topic):
                assert matches(rule, topic), (rule, sub, topic)


@given(filters)
def test_every_filter_covers_itself_and_hash_covers_every_non_dollar_filter(sub: str) -> None:
    assert covers(sub, sub)
    assert covers("#", sub) is (not sub.startswith("$"))


# --- the ACL file: structure -------------------------------------------------------------------

FILE = """
# Anonymous clients may read the public tree.
topic read public/#

user alice
topic readwrite alice/#
topic write   shared/inbox

user bob smith
topic read with spaces/in the topic
topic bob/default

pattern write devices/%c/status
"""


def test_leading_topic_lines_are_for_anonymous_clients_only() -> None:
    rules = AclRules.parse(FILE)
    assert decide_all(rules, None, "public/news") == (True, None, True)
    assert decide_all(rules, "alice", "public/news") == (None, None, None)
    assert decide_all(rules, "bob smith", "public/news") == (None, None, None)
    # An empty username is a user, not an anonymous client.
    assert decide_all(rules, "", "public/news") == (None, None, None)


def test_topic_lines_after_user_are_for_that_user() -> None:
    rules = AclRules.parse(FILE)
    assert decide_all(rules, "alice", "alice/x/y") == (True, True, True)
    assert decide_all(rules, "alice", "shared/inbox") == (None, True, None)
    assert decide_all(rules, None, "alice/x") == (None, None, None)
    assert decide_all(rules, "bob smith", "alice/x") == (None, None, None)
    assert decide_all(rules, "mallory", "alice/x") == (None, None, None)


def test_usernames_and_topics_may_contain_spaces() -> None:
    rules = AclRules.parse(FILE)
    assert decide_all(rules, "bob smith", "with spaces/in the topic") == (True, None, True)
    assert decide_all(rules, "bob", "with spaces/in the topic") == (None, None, None)
    assert decide_all(rules, "bob smith", "with spaces/in") == (None, None, None)


def test_access_defaults_to_readwrite() -> None:
    rules = AclRules.parse(FILE)
    assert decide_all(rules, "bob smith", "bob/default") == (True, True, True)


def test_patterns_apply_to_every_client_wherever_they_stand() -> None:
    rules = AclRules.parse(FILE)
    for user in (None, "alice", "bob smith", "mallory"):
        assert decide_all(rules, user, "devices/c1/status", client="c1") == (None, True, None)
        assert decide_all(rules, user, "devices/c2/status", client="c1") == (None, None, None)


def test_user_blocks_of_one_name_add_up() -> None:
    rules = AclRules.parse("user u\ntopic read a\nuser v\ntopic read b\nuser u\ntopic write c\n")
    assert decide_all(rules, "u", "a") == (True, None, True)
    assert decide_all(rules, "u", "c") == (None, True, None)
    assert decide_all(rules, "u", "b") == (None, None, None)
    assert decide_all(rules, "v", "b") == (True, None, True)


def test_comments_blank_lines_whitespace_and_crlf() -> None:
    text = (
        "  # a comment\r\n\r\n\t topic   read   a/b  \r\n#topic write a/b\r\n   \r\nuser  u  \r\n"
    )
    text += "topic write x\r\n"
    rules = AclRules.parse(text)
    assert rules.rule_count == 2
    assert decide_all(rules, None, "a/b") == (True, None, True)
    assert decide_all(rules, "u", "x") == (None, True, None)


def test_a_topic_named_like_a_comment_is_a_topic() -> None:
    rules = AclRules.parse("topic #")
    assert decide_all(rules, None, "anything/at/all") == (True, True, True)


def test_percent_signs_are_literal_in_topic_lines() -> None:
    rules = AclRules.parse("topic read t/%u\n")
    assert rules.decide(None, "c1", READ, "t/%u") is True
    assert rules.decide(None, "c1", READ, "t/c1") is None


def test_rule_count_and_empty_file() -> None:
    assert AclRules.parse(FILE).rule_count == 6
    empty = AclRules.parse("")
    assert empty.rule_count == 0
    assert decide_all(empty, None, "a") == (None, None, None)
    assert decide_all(empty, "u", "a") == (None, None, None)


def test_rules_compare_and_hash_by_their_lines() -> None:
    # A pattern means the same wherever it stands.
    assert AclRules.parse("pattern read a/%u") == AclRules.parse("user u\npattern read a/%u")
    assert AclRules.parse(FILE) == AclRules.parse(FILE)
    assert hash(AclRules.parse(FILE)) == hash(AclRules.parse(FILE))
    assert AclRules.parse("topic a") != AclRules.parse("topic read a")
    assert AclRules.parse("topic a") != AclRules.parse("user u\ntopic a")


# --- the ACL file: deny ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "topic readwrite a/#\ntopic deny a/secret\n",
        "topic deny a/secret\ntopic readwrite a/#\n",
    ],
)
def test_deny_wins_over_grants_in_any_order(text: str) -> None:
    rules = AclRules.parse(text)
    assert decide_all(rules, None, "a/secret") == (False, False, False)
    assert decide_all(rules, None, "a/public") == (True, True, True)
    # The subscription to the tree stays allowed; its secret messages are refused at delivery.
    assert rules.decide(None, "c", SUBSCRIBE, "a/#") is True
    assert rules.decide(None, "c", SUBSCRIBE, "a/secret") is False


def test_deny_without_grants_denies() -> None:
    rules = AclRules.parse("topic deny a/#\n")
    assert decide_all(rules, None, "a/b") == (False, False, False)
    assert decide_all(rules, None, "b") == (None, None, None)


def test_deny_pattern_wins_over_a_users_grant() -> None:
    rules = AclRules.parse("user u\ntopic readwrite #\npattern deny private/%c/#\n")
    assert decide_all(rules, "u", "private/c1/x", client="c1") == (False, False, False)
    assert decide_all(rules, "u", "private/c2/x", client="c1") == (True, True, True)


def test_users_deny_wins_over_a_pattern_grant() -> None:
    rules = AclRules.parse("pattern readwrite home/%u/#\nuser u\ntopic deny home/u/locked\n")
    assert decide_all(rules, "u", "home/u/locked") == (False, False, False)
    assert decide_all(rules, "u", "home/u/open") == (True, True, True)


def test_deny_pattern_after_a_grant_pattern_still_wins() -> None:
    rules = AclRules.parse("pattern readwrite %c/#\npattern deny %c/keys\n")
    assert decide_all(rules, None, "c1/keys") == (False, False, False)
    assert decide_all(rules, None, "c1/data") == (True, True, True)


# --- the ACL file: patterns --------------------------------------------------------------------


def test_username_pattern() -> None:
    rules = AclRules.parse("pattern readwrite users/%u/#\n")
    assert decide_all(rules, "alice", "users/alice/inbox") == (True, True, True)
    assert decide_all(rules, "alice", "users/bob/inbox") == (None, None, None)


def test_username_pattern_never_matches_an_anonymous_client() -> None:
    rules = AclRules.parse("pattern readwrite users/%u/#\npattern read anon/%c\n")
    assert decide_all(rules, None, "users/None/x") == (None, None, None)
    assert decide_all(rules, None, "users//x") == (None, None, None)
    assert decide_all(rules, None, "anon/c1") == (True, None, True)


def test_placeholders_inside_a_level_and_both_in_one_pattern() -> None:
    rules = AclRules.parse("pattern read t/pre_%u_%c/x\n")
    assert rules.decide("u", "c", READ, "t/pre_u_c/x") is True
    assert rules.decide("u", "c", READ, "t/pre_c_u/x") is None


def test_a_username_holding_a_placeholder_is_not_substituted_again() -> None:
    rules = AclRules.parse("pattern read u/%u\n")
    assert rules.decide("%c", "c1", READ, "u/%c") is True
    assert rules.decide("%c", "c1", READ, "u/c1") is None


@pytest.mark.parametrize(
    ("username", "client_id"), [("+", "c1"), ("#", "c1"), ("a+b", "c1"), ("u", "+"), ("u", "x#")]
)
def test_wildcards_in_names_never_match_patterns(username: str, client_id: str) -> None:
    rules = AclRules.parse("pattern readwrite dev/%u/%c\npattern read all/%u/#\n")
    # With '+' or '#' substituted, these would reach every device and every user's tree.
    for topic in ("dev/alice/c1", f"dev/{username}/{client_id}", "all/alice/x"):
        assert decide_all(rules, username, topic, client=client_id) == (None, None, None)
    assert rules.decide(username, client_id, SUBSCRIBE, "all/+/x") is None


def test_wildcard_names_still_get_their_plain_topic_rules() -> None:
    rules = AclRules.parse("user +\ntopic read plain\npattern read p/%u\n")
    assert rules.decide("+", "c", READ, "plain") is True
    assert rules.decide("+", "c", READ, "p/x") is None


# --- the ACL file: $ topics and subscriptions --------------------------------------------------


def test_hash_does_not_reach_sys_topics() -> None:
    rules = AclRules.parse("topic readwrite #\n")
    assert decide_all(rules, None, "$SYS/broker/uptime") == (None, None, None)
    assert rules.decide(None, "c", SUBSCRIBE, "$SYS/#") is None
    assert rules.decide(None, "c", SUBSCRIBE, "#") is True


def test_sys_topics_are_reached_where_a_rule_names_them() -> None:
    rules = AclRules.parse("topic read $SYS/#\n")
    assert decide_all(rules, None, "$SYS/broker/uptime") == (True, None, True)
    assert rules.decide(None, "c", SUBSCRIBE, "$SYS/broker/+") is True
    assert rules.decide(None, "c", SUBSCRIBE, "#") is None


def test_subscribe_needs_a_read_rule_covering_the_filter() -> None:
    rules = AclRules.parse("topic read a/#\ntopic read b/+\ntopic write c/#\n")
    assert rules.decide(None, "c", SUBSCRIBE, "a/+/c") is True
    assert rules.decide(None, "c", SUBSCRIBE, "a") is True
    assert rules.decide(None, "c", SUBSCRIBE, "b/x") is True
    assert rules.decide(None, "c", SUBSCRIBE, "b/#") is None
    assert rules.decide(None, "c", SUBSCRIBE, "c/x") is None
    assert rules.decide(None, "c", SUBSCRIBE, "#") is None


def test_subscribe_is_denied_only_when_a_deny_rule_covers_the_filter() -> None:
    rules = AclRules.parse("topic read #\ntopic deny a/+/secret\n")
    assert rules.decide(None, "c", SUBSCRIBE, "a/b/secret") is False
    assert rules.decide(None, "c", SUBSCRIBE, "a/+/secret") is False
    assert rules.decide(None, "c", SUBSCRIBE, "a/#") is True
    assert rules.decide(None, "c", READ, "a/b/secret") is False


def test_subscribe_through_patterns() -> None:
    rules = AclRules.parse("pattern read feeds/%u/#\npattern deny feeds/%u/private/#\n")
    assert rules.decide("u", "c", SUBSCRIBE, "feeds/u/+") is True
    assert rules.decide("u", "c", SUBSCRIBE, "feeds/u/private/+") is False
    assert rules.decide("u", "c", SUBSCRIBE, "feeds/+/x") is None


def test_subscribe_through_patterns_compares_filters_not_names() -> None:
    # Read as a topic name, the filter `feeds/u/#` would match the rule `feeds/%u/+`.
    rules = AclRules.parse("pattern read feeds/%u/+\n")
    assert rules.decide("u", "c", SUBSCRIBE, "feeds/u/x") is True
    assert rules.decide("u", "c", SUBSCRIBE, "feeds/u/#") is None


def test_many_users_and_rules() -> None:
    lines = []
    for index in range(300):
        lines.append(f"user u{index}")
        lines.extend(f"topic read t/{index}/{sub}/#" for sub in range(10))
    rules = AclRules.parse("\n".join(lines))
    assert rules.rule_count == 3000
    assert rules.decide("u7", "c", READ, "t/7/9/x") is True
    assert rules.decide("u7", "c", READ, "t/8/9/x") is None
    assert rules.decide("u7", "c", READ, "t/7/10/x") is None


# --- the ACL file: errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("topic a\n\n# c\ntopic rw a/b\n", "line 4: unknown access 'rw' (read, write, readwrite"),
        ("topic with spaces\n", "line 1: unknown access 'with'"),
        ("topic a\ntopics a\n", "line 2: unknown keyword 'topics' (user, topic, pattern)"),
        ("subscribe a\n", "line 1: unknown keyword 'subscribe'"),
        ("topic subscribe a/b\n", "line 1: unknown access 'subscribe'"),
        ("user\n", "line 1: 'user' needs a username"),
        ("user   \t\n", "line 1: 'user' needs a username"),
        ("topic\n", "line 1: 'topic' needs a topic"),
        ("\npattern   \n", "line 2: 'pattern' needs a topic"),
        ("topic read\n", "line 1: 'topic' needs a topic after 'read'"),
        ("topic deny \n", "line 1: 'topic' needs a topic after 'deny'"),
        ("topic read a/#/b\n", "line 1: topic filter 'a/#/b': '#' is allowed only"),
        ("topic read a/b+\n", "line 1: topic filter 'a/b+': '+' is allowed only"),
        ("pattern write x/%u#\n", "line 1: topic filter 'x/%u#'"),
        ("topic read $share/g/a/#\n", "line 1: '$share/g/a/#' is a shared subscription"),
        ("READ a\n", "line 1: unknown keyword 'READ'"),
    ],
)
def test_errors_name_the_line(text: str, expected: str) -> None:
    assert parse_error(text).startswith(expected)


def test_long_values_are_cut_short_in_errors() -> None:
    message = parse_error("topic " + "x" * 1000 + " a\n")
    assert "line 1: unknown access 'xxxx" in message
    assert len(message) < 200


# --- claims: the list format -------------------------------------------------------------------


def test_list_format_publish_subscribe_all() -> None:
    acl = ClaimAcl.from_claim(
        [
            {"permission": "allow", "action": "publish", "topic": "up/${clientid}"},
            {"permission": "allow", "action": "subscribe", "topic": "down/${username}/#"},
            {"permission": "allow", "action": "all", "topic": "both"},
        ]
    )
    assert acl.rule_count == 3
    assert decide_all(acl, "u", "up/c1", client="c1") == (None, True, None)
    assert decide_all(acl, "u", "up/c2", client="c1") == (None, None, None)
    assert decide_all(acl, "u", "down/u/x") == (True, None, True)
    assert acl.decide("u", "c1", SUBSCRIBE, "down/u/+/z") is True
    assert acl.decide("u", "c1", SUBSCRIBE, "down/#") is None
    assert acl.decide("u", "c1", SUBSCRIBE, "down/u/#") is True
    narrow = ClaimAcl.from_claim([{"permission": "allow", "action": "sub", "topic": "a/+"}])
    assert narrow.decide("u", "c1", SUBSCRIBE, "a/x") is True
    assert narrow.decide("u", "c1", SUBSCRIBE, "a/#") is None
    assert decide_all(acl, "u", "down/v/x") == (None, None, None)
    assert decide_all(acl, "u", "both") == (True, True, True)


def test_list_format_short_action_names() -> None:
    acl = ClaimAcl.from_claim(
        [
            {"permission": "allow", "action": "pub", "topic": "p"},
            {"permission": "allow", "action": "sub", "topic": "s"},
        ]
    )
    assert decide_all(acl, "u", "p") == (None, True, None)
    assert decide_all(acl, "u", "s") == (True, None, True)


def test_list_format_first_matching_rule_wins() -> None:
    deny_first = ClaimAcl.from_claim(
        [
            {"permission": "deny", "action": "all", "topic": "t/secret"},
            {"permission": "allow", "action": "all", "topic": "t/#"},
        ]
    )
    allow_first = ClaimAcl.from_claim(
        [
            {"permission": "allow", "action": "all", "topic": "t/#"},
            {"permission": "deny", "action": "all", "topic": "t/secret"},
        ]
    )
    assert decide_all(deny_first, "u", "t/secret") == (False, False, False)
    assert decide_all(deny_first, "u", "t/other") == (True, True, True)
    assert decide_all(allow_first, "u", "t/secret") == (True, True, True)


def test_list_format_rules_only_speak_of_their_action() -> None:
    acl = ClaimAcl.from_claim(
        [
            {"permission": "deny", "action": "publish", "topic": "t/#"},
            {"permission": "allow", "action": "all", "topic": "t/#"},
        ]
    )
    assert decide_all(acl, "u", "t/x") == (True, False, True)


def test_list_format_deny_subscribe_covers_filters_and_denies_delivery() -> None:
    acl = ClaimAcl.from_claim(
        [
            {"permission": "deny", "action": "subscribe", "topic": "a/secret"},
            {"permission": "allow", "action": "subscribe", "topic": "a/#"},
        ]
    )
    assert acl.decide("u", "c", SUBSCRIBE, "a/#") is True
    assert acl.decide("u", "c", SUBSCRIBE, "a/secret") is False
    assert acl.decide("u", "c", READ, "a/secret") is False
    assert acl.decide("u", "c", READ, "a/open") is True


def test_list_format_topics_list_qos_and_retain() -> None:
    acl = ClaimAcl.from_claim(
        [
            {
                "permission": "allow",
                "action": "publish",
                "topics": ["a", "b/+"],
                "qos": [1],
                "retain": False,
            }
        ]
    )
    assert acl.rule_count == 2
    assert acl.decide("u", "c", WRITE, "a") is True
    assert acl.decide("u", "c", WRITE, "b/x") is True
    assert acl.decide("u", "c", WRITE, "c") is None


def test_eq_topics_match_as_text() -> None:
    acl = ClaimAcl.from_claim([{"permission": "allow", "action": "all", "topic": "eq t/1/#"}])
    assert acl.decide("u", "c", SUBSCRIBE, "t/1/#") is True
    assert acl.decide("u", "c", SUBSCRIBE, "t/1/x") is None
    assert acl.decide("u", "c", SUBSCRIBE, "t/1/+") is None
    assert acl.decide("u", "c", READ, "t/1/x") is True  # delivered through that filter
    assert acl.decide("u", "c", WRITE, "t/1") is None
    plain = ClaimAcl.from_claim([{"permission": "allow", "action": "all", "topic": "eq a/b"}])
    assert decide_all(plain, "u", "a/b") == (True, True, True)


def test_eq_topics_take_no_placeholders() -> None:
    acl = ClaimAcl.from_claim([{"permission": "allow", "action": "pub", "topic": "eq t/${foo}"}])
    assert acl.decide("u", "c", WRITE, "t/${foo}") is True


def test_claim_placeholders() -> None:
    acl = ClaimAcl.from_claim(
        [{"permission": "allow", "action": "all", "topic": "x/${username}/${clientid}"}]
    )
    assert acl.decide("u", "c", WRITE, "x/u/c") is True
    assert acl.decide("u", "c", WRITE, "x/c/u") is None
    assert acl.decide(None, "c", WRITE, "x//c") is None
    assert acl.decide("+", "c", SUBSCRIBE, "x/+/c") is None
    assert acl.decide("u", "#", WRITE, "x/u/anything") is None


def test_wildcard_names_do_not_escape_a_claim_deny() -> None:
    acl = ClaimAcl.from_claim(
        [
            {"permission": "deny", "action": "all", "topic": "own/${clientid}/#"},
            {"permission": "allow", "action": "all", "topic": "own/#"},
        ]
    )
    assert acl.decide("u", "c1", WRITE, "own/c1/x") is False
    assert acl.decide("u", "c1", WRITE, "own/c2/x") is True


def test_list_format_keeps_percent_signs_literal() -> None:
    acl = ClaimAcl.from_claim([{"permission": "allow", "action": "pub", "topic": "t/%u"}])
    assert acl.decide("u", "c", WRITE, "t/%u") is True
    assert acl.decide("u", "c", WRITE, "t/u") is None


def test_claim_sys_topics() -> None:
    acl = ClaimAcl.from_claim([{"permission": "allow", "action": "all", "topic": "#"}])
    assert decide_all(acl, "u", "$SYS/x") == (None, None, None)
    assert decide_all(acl, "u", "x") == (True, True, True)


def test_empty_claims_decide_nothing_or_deny_in_the_closed_format() -> None:
    for claim, decided in (([], None), ({}, False)):
        acl = ClaimAcl.from_claim(claim)
        assert acl.rule_count == 0
        assert decide_all(acl, "u", "t") == (decided, decided, decided)


def test_the_object_format_denies_what_it_does_not_grant() -> None:
    acl = ClaimAcl.from_claim({"pub": ["out/#"], "sub": ["in/#"]})
    assert decide_all(acl, "u", "out/x") == (False, True, False)
    assert decide_all(acl, "u", "in/x") == (True, False, True)
    assert decide_all(acl, "u", "elsewhere") == (False, False, False)


def test_claims_are_hashable_and_compare_by_rules() -> None:
    claim = [{"permission": "allow", "action": "pub", "topic": "t"}]
    assert ClaimAcl.from_claim(claim) == ClaimAcl.from_claim(claim)
    assert hash(ClaimAcl.from_claim(claim)) == hash(ClaimAcl.from_claim(claim))
    assert ClaimAcl.from_claim(claim) != ClaimAcl.from_claim({"sub": ["t"]})


# --- claims: the object format -----------------------------------------------------------------


def test_object_format() -> False:
    acl = ClaimAcl.from_claim({"pub": ["p/${clientid}"], "sub": ["s/#"], "all": ["both"]})
    assert acl.rule_count == 3
    assert decide_all(acl, "u", "p/c1", client="c1") == (False, True, False)
    assert decide_all(acl, "u", "s/x") == (True, False, True)
    assert acl.decide("u", "c1", SUBSCRIBE, "s/+") is True
    assert decide_all(acl, "u", "both") == (True, True, True)
    assert decide_all(acl, "u", "other") == (False, False, False)


def test_object_format_accepts_emqx_4_placeholders() -> False:
    acl = ClaimAcl.from_claim({"pub": ["stats/%c", "users/%u/#"]})
    assert acl.decide("u", "c1", WRITE, "stats/c1") is True
    assert acl.decide("u", "c1", WRITE, "users/u/x") is True
    assert acl.decide("u", "c1", WRITE, "stats/%c") is False
    assert acl.decide(None, "c1", WRITE, "users//x") is False
    assert acl.decide("u", "c+", WRITE, "stats/c+") is False


# --- claims: malformed -------------------------------------------------------------------------


def rule(**fields: object) -> dict[str, object]:
    base: dict[str, object] = {"permission": "allow", "action": "publish", "topic": "t"}
    base.update(fields)
    return {key: value for key, value in base.items() if value is not None}


@pytest.mark.parametrize(
    ("claim", "expected"),
    [
        ("t/#", "acl claim must be a list of rules or an object of pub/sub/all lists, not str"),
        (None, "acl claim must be a list"),
        (7, "acl claim must be a list"),
        (["t/#"], "acl claim rule 1: a rule is an object, not 't/#'"),
        ([rule(), 3], "acl claim rule 2: a rule is an object, not int"),
        ([rule(permission=None)], "acl claim rule 1: unknown permission NoneType (allow, deny)"),
        ([rule(permission="Allow")], "acl claim rule 1: unknown permission 'Allow'"),
        ([rule(permission=["allow"])], "acl claim rule 1: unknown permission list"),
        (
            [rule(action="push")],
            "acl claim rule 1: unknown action 'push' (publish, subscribe, pub, sub, all)",
        ),
        ([rule(action=None)], "acl claim rule 1: unknown action NoneType"),
        ([rule(action=["pub"])], "acl claim rule 1: unknown action list"),
        ([rule(topic=None)], "acl claim rule 1: a rule has either 'topic' or 'topics'"),
        ([rule(topics=["a"])], "acl claim rule 1: a rule has either 'topic' or 'topics'"),
        ([rule(topic=None, topics="a")], "acl claim rule 1: topics come in a list, not 'a'"),
        ([rule(topic=5)], "acl claim rule 1: a topic is a string, not int"),
        ([rule(topic=None, topics=["a", None])], "acl claim rule 1: a topic is a string"),
        ([rule(topic="")], "acl claim rule 1: topic filter is empty"),
        ([rule(topic="a/#/b")], "acl claim rule 1: topic filter 'a/#/b'"),
        ([rule(topic="eq a/#/b")], "acl claim rule 1: topic filter 'a/#/b'"),
        ([rule(topic="$share/g/t")], "acl claim rule 1: '$share/g/t' is a shared subscription"),
        ([rule(topic="t/${peerhost}")], "acl claim rule 1: unsupported placeholder '${peerhost}'"),
        ([rule(ipaddr="10.0.0.0/8")], "acl claim rule 1: unsupported field 'ipaddr'"),
        ({"pubsub": ["a"]}, "acl claim: unknown key 'pubsub' (pub, sub, all)"),
        ({1: ["a"]}, "acl claim: unknown key int"),
        ({"pub": "a"}, "acl claim 'pub': topics come in a list, not 'a'"),
        ({"sub": [None]}, "acl claim 'sub': a topic is a string, not NoneType"),
        ({"all": ["a+"]}, "acl claim 'all': topic filter 'a+'"),
        ({"pub": ["t/${peerhost}"]}, "acl claim 'pub': unsupported placeholder '${peerhost}'"),
    ],
)
def test_malformed_claims(claim: object, expected: str) -> None:
    assert claim_error(claim).startswith(expected)


def test_claims_are_bounded() -> None:
    assert ClaimAcl.from_claim([rule()] * MAX_CLAIM_RULES).rule_count == MAX_CLAIM_RULES
    assert "more than 1000 rules" in claim_error([rule()] * (MAX_CLAIM_RULES + 1))
    half = MAX_CLAIM_RULES // 2
    assert "more than 1000 rules" in claim_error(
        [rule(topic=None, topics=["t"] * half), rule(topic=None, topics=["t"] * (half + 1))]
    )
    assert "more than 1000 rules" in claim_error({"pub": ["t"] * half, "sub": ["t"] * (half + 1)})
    assert ClaimAcl.from_claim([rule(topic="t" * 65535)]).rule_count == 1
    assert "longer than 65535 bytes" in claim_error([rule(topic="t" * 65536)])


def test_an_exact_subscribe_grant_delivers_what_its_filter_matches() -> None:
    acl = ClaimAcl.from_claim(
        [
            {"permission": "allow", "action": "subscribe", "topic": "eq sensors/#"},
            {"permission": "deny", "action": "subscribe", "topic": "eq secret/#"},
        ]
    )
    assert acl.decide("u", "c", SUBSCRIBE, "sensors/#") is True
    assert acl.decide("u", "c", SUBSCRIBE, "sensors/+") is None  # only the literal filter
    assert acl.decide("u", "c", READ, "sensors/kitchen") is True
    assert acl.decide("u", "c", SUBSCRIBE, "secret/#") is False
    assert acl.decide("u", "c", READ, "secret/x") is None
