from django.apps import AppConfig


class RolloutsConfig(AppConfig):
    name = "rollouts"

    def ready(self) -> None:
        # Web, worker and every command start here: none may run on an unpinned crafter.
        from rollouts.library_pins import library_pins_check

        library_pins_check()
