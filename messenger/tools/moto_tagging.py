"""GetResources with a ResourceARNList answered as AWS answers it: every named resource at once.

AWS's Resource Groups Tagging API takes at most 100 ARNs in `ResourceARNList` and then refuses
the pagination parameters (ResourcesPerPage, TagsPerPage, PaginationToken): the answer holds
every named resource that has tags, in one response. Stock moto 5.2.5 pages it like a tag-filter
query, by at most 100 tags when TagsPerPage is not given (five queues with 20 tags each), and
accepts any number of ARNs. `apply()` makes the local endpoint answer such a request in one
page and refuse more than 100 ARNs, so what the ops Lambdas' call counts show locally
(bench/ops.py) is what they cost on AWS. Requests without an ARN list are unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

from messenger.tools.moto_sqs import MOTO_VERSION  # the release both are written against

#: AWS's limit on ResourceARNList.
MAX_ARNS = 100

log = logging.getLogger(__name__)
_applied = False


def apply() -> bool:
    """Patch moto's tagging backend in this process; False (and a log line) on another moto."""
    global _applied
    import moto
    from moto.resourcegroupstaggingapi.exceptions import ResourceGroupsTaggingAPIError
    from moto.resourcegroupstaggingapi.models import ResourceGroupsTaggingAPIBackend

    if _applied:
        return True
    if moto.__version__ != MOTO_VERSION:
        log.warning("moto %s is not %s: GetResources by ARN keeps stock moto's paging",
                    moto.__version__, MOTO_VERSION)
        return False
    stock = ResourceGroupsTaggingAPIBackend.get_resources

    def get_resources(self: Any, pagination_token: str | None = None, *args: Any,
                      **kwargs: Any) -> Any:
        arns = kwargs.get("resource_arn_list")
        if not arns or pagination_token:
            return stock(self, pagination_token, *args, **kwargs)
        if len(arns) > MAX_ARNS:
            raise ResourceGroupsTaggingAPIError(
                "InvalidParameterException",
                f"ResourceARNList may hold at most {MAX_ARNS} ARNs, got {len(arns)}")
        wanted = set(arns)
        return None, list(self._get_resources_generator(
            tag_filters=kwargs.get("tag_filters"),
            resource_type_filters=kwargs.get("resource_type_filters"),
            resource_arn_list=wanted))

    ResourceGroupsTaggingAPIBackend.get_resources = get_resources  # type: ignore[method-assign]
    _applied = True
    return True
