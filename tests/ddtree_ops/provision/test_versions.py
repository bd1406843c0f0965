"""Version comparisons go through packaging.version: numeric per part, never text, never split by hand."""

from ddtree_ops.provision import versions


def test_numeric_not_textual_order():
    assert versions.at_least("580.65.06", "580.9")  # 65 > 9, although "6" < "9" as text
    assert not versions.at_least("575.57.08", "580.65.06")
    assert versions.at_least("13.0", "12.9") and versions.at_least("2.35", "2.28")
    assert not versions.at_least(None, "12.9") and not versions.at_least("", "1")


def test_python_versions_compare_by_major_and_minor():
    assert versions.major_minor("3.10.12") > versions.major_minor("3.9")  # 10 > 9
    assert versions.major_minor("3.13.1") <= versions.major_minor("3.13")  # a micro release stays in range
    assert versions.python_tag("3.12.3") == "cp312" and versions.python_tag("x") is None
    assert versions.major("13.0") == "13"
