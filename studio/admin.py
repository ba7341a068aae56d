from django.contrib import admin
from django.contrib.admin.utils import display_for_value

from studio.endpoints import endpoint_key_set
from studio.models import Endpoint, LoginFailure
from studio.spend import price_text


@admin.register(Endpoint)
class EndpointAdmin(admin.ModelAdmin):
    """Staff with the view permission may look; only superusers add, change or delete.

    Whoever edits an endpoint decides which server variable is sent to which URL: a staff
    user given the endpoint permissions could name SECRET_KEY and a listener of their own.
    The permissions a staff user holds do not change that.
    """

    list_display = ("name", "kind", "base_url", "api_key_env", "key_set", "prices", "enabled")
    list_filter = ("kind", "enabled")
    search_fields = ("name", "base_url")

    @admin.display(description="key set on this server")
    def key_set(self, endpoint: Endpoint) -> str:
        # Whether its own variable is set here, never the value. Django's boolean column
        # shows None as "unknown", but a keyless endpoint is not in doubt: it needs none.
        key_set = endpoint_key_set(endpoint)
        if key_set is None:
            return "no key needed"
        return display_for_value(key_set, "", boolean=True)

    @admin.display(description="$ per million tokens (in / out)")
    def prices(self, endpoint: Endpoint) -> str:
        # Spend on the batch pages comes from these (studio.spend); unknown until both are set.
        if endpoint.input_price_per_million is None or endpoint.output_price_per_million is None:
            return "—"
        prices = (endpoint.input_price_per_million, endpoint.output_price_per_million)
        return " / ".join(price_text(price) for price in prices)

    def has_add_permission(self, request) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_change_permission(self, request, obj=None) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_delete_permission(self, request, obj=None) -> bool:
        return request.user.is_active and request.user.is_superuser


@admin.register(LoginFailure)
class LoginFailureAdmin(admin.ModelAdmin):
    """Failed logins that count toward the throttle; deleting a user's rows unlocks them."""

    list_display = ("username", "address", "at")
    search_fields = ("username", "address")
    readonly_fields = ("username", "address", "at")

    def has_add_permission(self, request) -> bool:
        return False
