import pytest

from messenger.errors import InvalidSettings
from messenger.settings import Settings


def test_defaults_and_environment():
    settings = Settings.from_env({"MESSENGER_NAMESPACE": "dev", "AWS_REGION": "eu-west-1"})
    assert settings.namespace == "dev"
    assert settings.provisioning == "auto"
    assert settings.region == "eu-west-1"
    assert settings.kms_alias == "alias/dev-messenger"
    assert settings.bucket_name("123") == "dev-messenger-offload-123-eu-west-1"
    assert Settings.from_env(settings.as_env()) == settings


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"MESSENGER_PROVISIONING": "sometimes"}, "must be one of auto, verify"),
        ({"MESSENGER_OFFLOAD_THRESHOLD": "2000000"}, "from 1 to 1048576"),
        ({"MESSENGER_OFFLOAD_THRESHOLD": "big"}, "MESSENGER_OFFLOAD_THRESHOLD must be a number"),
        ({"MESSENGER_RETRY_BUDGET": "0"}, "must be a finite number of seconds > 0"),
        ({"MESSENGER_RETRY_BUDGET": "nan"}, r"MESSENGER_RETRY_BUDGET\) .* got nan"),
        ({"MESSENGER_RETRY_BUDGET": "inf"}, r"MESSENGER_RETRY_BUDGET\) .* got inf"),
        ({"MESSENGER_NAMESPACE": "a b"}, "MESSENGER_NAMESPACE"),
    ],
)
def test_bad_settings_name_the_variable(env, fragment):
    with pytest.raises(InvalidSettings, match=fragment):
        Settings.from_env(env)
