from django.contrib import admin

from studio.endpoints import endpoint_api_key
from studio.models import Endpoint, LoginFailure


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "base_url", "api_key_env", "key_set", "enabled")
    list_filter = ("kind", "enabled")
    search_fields = ("name", "base_url")

    @admin.display(boolean=True, description="key set on this server")
    def key_set(self, endpoint: Endpoint) -> bool:
        # Whether the variable is set here, never its value.
        return bool(endpoint_api_key(endpoint))


@admin.register(LoginFailure)
class LoginFailureAdmin(admin.ModelAdmin):
    """Failed logins that count toward the throttle; deleting a user's rows unlocks them."""

    list_display = ("username", "address", "at")
    search_fields = ("username", "address")
    readonly_fields = ("username", "address", "at")

    def has_add_permission(self, request) -> bool:
        return False
