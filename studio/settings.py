"""Settings from environment variables (`docs/configuration.md`); every default works for
`make demo`."""

import re
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

BASE_DIR = Path(__file__).resolve().parent.parent
env = environ.Env()

# Everything the demo writes (SQLite file, broker, media, secret key) lives here.
VAR_DIR = Path(env.str("STUDIO_VAR_DIR", default=str(BASE_DIR / "var")))

DEBUG = env.bool("DEBUG", default=False)


def _secret_key() -> str:
    key = env.str("SECRET_KEY", default="")
    if key:
        return key
    from studio.secret_key import secret_key_from_file, secret_key_missing

    if not DEBUG:
        secret_key_missing()
    # Persisted so that logins survive a restart of the development server.
    return secret_key_from_file(VAR_DIR / "secret_key")


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "django.forms",
    "django_htmx",
    "studio",
    "rollouts",
    "curation",
    "training",
    "evaluation",
    "probes",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "studio.middleware.reject_nul_bytes",
    # Review pages carry every turn of an episode (a 256-turn viewer is ~580 KB of HTML).
    # Django masks CSRF tokens per response, which is what makes compressing them safe.
    "django.middleware.gzip.GZipMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "studio.middleware.throttle_logins",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.auth.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "studio.urls"
WSGI_APPLICATION = "studio.wsgi.application"

# Widgets may use the project's templates (the searchable checkbox list).
FORM_RENDERER = "django.forms.renderers.TemplatesSetting"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'studio.sqlite3'}"),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Parameters travel apart from the SQL: psycopg need not quote every value of a bulk
    # insert into the query text (a third of the recorder's database CPU).
    DATABASES["default"].setdefault("OPTIONS", {})["server_side_binding"] = True
    # A statement a connection runs a second time is prepared on the server, which then
    # skips parsing and planning it: the recorder's inserts, the claims, heartbeats and ends
    # repeat all day. Behind a pooler that cannot carry prepared statements (PgBouncer before
    # 1.21 in transaction mode), set STUDIO_DB_PREPARE_THRESHOLD=off.
    _prepare = env.str("STUDIO_DB_PREPARE_THRESHOLD", default="2").strip().lower()
    if _prepare not in ("off", "") and not _prepare.isdigit():
        raise ImproperlyConfigured(
            f"STUDIO_DB_PREPARE_THRESHOLD must be a whole number or off, not {_prepare!r}"
        )
    DATABASES["default"]["OPTIONS"]["prepare_threshold"] = (
        int(_prepare) if _prepare.isdigit() else None
    )
    # ... but planned anew on every run, for the values it runs with. After five runs of a
    # prepared statement PostgreSQL may switch to one generic plan for any value, and for
    # the skewed filters of the review pages that plan can be many times slower, from a web
    # process's sixth view of a page on (`benchmarks/scale.py`). Parsing is still saved.
    _options = DATABASES["default"]["OPTIONS"]
    if "plan_cache_mode" not in _options.get("options", ""):
        _options["options"] = (
            _options.get("options", "") + " -c plan_cache_mode=force_custom_plan"
        ).strip()
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    Path(DATABASES["default"]["NAME"]).parent.mkdir(parents=True, exist_ok=True)
    # The demo's web server and worker share the file: wait for locks instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 30, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
    # SQLite ignores the columns some PostgreSQL indexes carry (INCLUDE): harmless for the demo.
    SILENCED_SYSTEM_CHECKS = ["models.W040"]
DATABASES["default"]["ATOMIC_REQUESTS"] = False
DATABASES["default"].setdefault("TEST", {})
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/rollouts/"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "studio" / "static"]
# Serve static files straight from the source tree: no collectstatic step for a self-hosted tool.
WHITENOISE_USE_FINDERS = True
STATIC_ROOT.mkdir(parents=True, exist_ok=True)

# Frame PNGs and exports. Served only through login-checked views, never as public media.
STUDIO_MEDIA_ROOT = Path(env.str("STUDIO_MEDIA_ROOT", default=str(VAR_DIR / "media")))
MEDIA_ROOT = STUDIO_MEDIA_ROOT
_S3_BUCKET = env.str("STUDIO_S3_BUCKET", default="")
STORAGES = {
    "default": (
        {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": _S3_BUCKET,
                "endpoint_url": env.str("STUDIO_S3_ENDPOINT_URL", default="") or None,
                "region_name": env.str("STUDIO_S3_REGION", default="") or None,
                "file_overwrite": True,
                "default_acl": None,
                "querystring_auth": True,
                # A file read whole (a download, a training upload's rows) spills to the
                # temporary folder past this size, instead of being held in memory.
                "max_memory_size": 10 * 1024 * 1024,
            },
        }
        if _S3_BUCKET
        else {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(STUDIO_MEDIA_ROOT)},
        }
    ),
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
# Trained open models and dataset exports fetched from storage for a training or serving
# process (training.model_store): a local cache, least recently used removed beyond the bound.
STUDIO_MODEL_CACHE_DIR = Path(
    env.str("STUDIO_MODEL_CACHE_DIR", default=str(VAR_DIR / "model-cache"))
)
STUDIO_MODEL_CACHE_BYTES = env.int("STUDIO_MODEL_CACHE_BYTES", default=50 * 1024**3)
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024

# Celery. Without CELERY_BROKER_URL, an embedded filesystem broker under var/ needs no server.
_BROKER_DIR = VAR_DIR / "broker"
# The embedded broker's host named, or kombu warns on every command that it assumed one.
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://localhost/")
if CELERY_BROKER_URL.startswith("filesystem://"):
    # kombu's own, but a worker never reads a message half written (studio.filesystem_broker).
    CELERY_BROKER_TRANSPORT = "studio.filesystem_broker:Transport"
    for _sub in ("queue", "processed", "control"):
        (_BROKER_DIR / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_BROKER_DIR / "queue"),
        "data_folder_out": str(_BROKER_DIR / "queue"),
        "processed_folder": str(_BROKER_DIR / "processed"),
        # kombu's default is ./control, outside var/
        "control_folder": str(_BROKER_DIR / "control"),
        "store_processed": False,
        # Polled: a short interval picks tasks up and shuts the worker down without a lag.
        "polling_interval": 0.1,
    }
else:
    # A message unacknowledged this long is delivered again; episodes are idempotent.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 2 * 3600}
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Three queues, and a worker without -Q consumes them all (`celery -A studio worker` takes
# every queue named here): the periodic requeue and takeover go on the control queue, so they
# never wait behind a batch's hundreds of episode messages, only for a worker's next free
# thread; work that waits on a model's answers (a job kind's `calls_model`) goes on the model
# queue, for a worker with a pool of threads, while baselines keep a process per core.
CELERY_TASK_DEFAULT_QUEUE = "celery"
STUDIO_CONTROL_QUEUE = "studio-control"
STUDIO_MODEL_QUEUE = "studio-model"
# Training an open model (the `trl` provider) takes a machine's cores or GPU for hours, and
# the `.[train]` extra: only a worker started with `-Q train` on such a machine takes it.
STUDIO_TRAIN_QUEUE = "train"
CELERY_TASK_QUEUES = [
    Queue("celery", Exchange("celery"), routing_key="celery"),
    Queue(STUDIO_CONTROL_QUEUE, Exchange(STUDIO_CONTROL_QUEUE), routing_key=STUDIO_CONTROL_QUEUE),
    Queue(STUDIO_MODEL_QUEUE, Exchange(STUDIO_MODEL_QUEUE), routing_key=STUDIO_MODEL_QUEUE),
    Queue(STUDIO_TRAIN_QUEUE, Exchange(STUDIO_TRAIN_QUEUE), routing_key=STUDIO_TRAIN_QUEUE),
]
CELERY_TASK_ROUTES = {
    "studio.tasks.jobs_requeue": {"queue": STUDIO_CONTROL_QUEUE},
    "training.tasks.training_local_run": {"queue": STUDIO_TRAIN_QUEUE},
}
CELERY_BEAT_SCHEDULE = {
    # Every job kind (`studio.jobs`): what a dead worker left, or what never reached the broker.
    # Often enough that an episode whose worker died (stale after 30 s) is taken over within
    # about 45 s; each round is a few indexed queries per kind.
    "requeue-jobs": {
        "task": "studio.tasks.jobs_requeue",
        "schedule": env.float("STUDIO_REQUEUE_EVERY_SECONDS", default=15.0),
    },
    "poll-training-jobs": {
        "task": "training.tasks.training_jobs_poll",
        "schedule": env.float("STUDIO_TRAINING_POLL_SECONDS", default=15.0),
    },
}
# Work whose message never reached the broker (it was down) is sent again by the periodic
# requeue once it is this old; work sent but still not started after the second figure is
# presumed lost and sent again (claims make duplicates harmless). A Redis that lost its data
# is noticed at once, not after the second figure: its requeue mark is gone, and every
# waiting job is sent again (`studio.queue.broker_lost_messages`).
STUDIO_REQUEUE_GRACE_SECONDS = env.int("STUDIO_REQUEUE_GRACE_SECONDS", default=30)
STUDIO_REQUEUE_PENDING_SECONDS = env.int("STUDIO_REQUEUE_PENDING_SECONDS", default=3600)

# An episode whose worker has not renewed its claim for this long is presumed dead and is
# taken over (resumed from its last written turn). A worker renews the claims of the episodes
# it plays every third of this, however long a model call takes.
STUDIO_EPISODE_STALE_SECONDS = env.int("STUDIO_EPISODE_STALE_SECONDS", default=30)
# How long an episode waits out a database it cannot reach (reconnecting, backing off) before
# it hands itself back to be resumed later; it is never failed for it.
STUDIO_DATABASE_OUTAGE_SECONDS = env.int("STUDIO_DATABASE_OUTAGE_SECONDS", default=300)
# A model request's slot (one of its endpoint's `--concurrency`) is leased for this long and
# renewed by its worker every third of it while the request runs: a dead worker's slots are
# free again within this long. A request waits out a limiter's Redis it cannot reach (its
# episode keeps its claim) for up to the second figure, then its episode is handed back.
STUDIO_LIMITER_LEASE_SECONDS = env.float("STUDIO_LIMITER_LEASE_SECONDS", default=10.0)
STUDIO_LIMITER_OUTAGE_SECONDS = env.int("STUDIO_LIMITER_OUTAGE_SECONDS", default=300)
# A person's game (or human fork) with no key pressed for this long is shown idle, not
# running: the batch pages stop refreshing for a game nobody may come back to.
STUDIO_HUMAN_IDLE_SECONDS = env.int("STUDIO_HUMAN_IDLE_SECONDS", default=1800)
# Every claimed job's stale window is a STUDIO_<KIND>_STALE_SECONDS of its own, named by its
# kind (`studio.jobs.JobKind.stale_setting`): a bulk flag and an import renew theirs as they
# progress (each chunk, each half second of progress), so theirs also bound a silent phase.
STUDIO_BULK_FLAG_STALE_SECONDS = env.int("STUDIO_BULK_FLAG_STALE_SECONDS", default=300)
# An export renews its claim from a thread of its own all along (`JobKind.kept`), so this is
# only how long a dead worker's export goes unnoticed (it was 600: "running 6000/19961" for
# ten minutes after its worker was killed).
STUDIO_EXPORT_STALE_SECONDS = env.int("STUDIO_EXPORT_STALE_SECONDS", default=60)
STUDIO_IMPORT_STALE_SECONDS = env.int("STUDIO_IMPORT_STALE_SECONDS", default=600)
# A probe run's chunk is renewed every third of this by its process (`studio.claim_keeper`),
# however long a model call takes: this is how long a dead worker's chunk goes unnoticed.
STUDIO_PROBE_CHUNK_STALE_SECONDS = env.int("STUDIO_PROBE_CHUNK_STALE_SECONDS", default=30)
# A model episode writes each turn as it is played, at most this often (seconds): calls that
# take longer are written one by one (see rollouts.recording.recorder).
STUDIO_LIVE_WRITE_SECONDS = env.float("STUDIO_LIVE_WRITE_SECONDS", default=1.0)
# Rows written per database round trip while recording an episode.
STUDIO_RECORD_CHUNK = env.int("STUDIO_RECORD_CHUNK", default=64)
# Pages count matching rows exactly up to this many, then show PostgreSQL's estimate
# ("about N"): an exact COUNT(*) over millions of turns would take seconds.
STUDIO_EXACT_COUNT_UP_TO = env.int("STUDIO_EXACT_COUNT_UP_TO", default=10_000)
# Turns a bulk flag changes per transaction on the worker (progress is saved after each).
STUDIO_BULK_FLAG_CHUNK = env.int("STUDIO_BULK_FLAG_CHUNK", default=5_000)
# The largest JSONL file the import page takes (the command reads files of any size).
STUDIO_IMPORT_MAX_BYTES = env.int("STUDIO_IMPORT_MAX_BYTES", default=512 * 1024 * 1024)
# The longest line an import reads (images are inline); a longer one is refused mid-read.
STUDIO_IMPORT_MAX_LINE_BYTES = env.int("STUDIO_IMPORT_MAX_LINE_BYTES", default=64 * 1024 * 1024)

# --- training ---
# Retries of a provider call that failed with 429, 5xx or a network error.
STUDIO_TRAINING_MAX_RETRIES = env.int("STUDIO_TRAINING_MAX_RETRIES", default=4)
# How often the beat task asks the provider about each active job.
STUDIO_TRAINING_POLL_SECONDS = env.float("STUDIO_TRAINING_POLL_SECONDS", default=15.0)
# A submission whose worker has not written for this long is presumed dead and re-claimed.
STUDIO_TRAINING_STALE_SECONDS = env.int("STUDIO_TRAINING_STALE_SECONDS", default=300)
# A `trl` run whose train worker has not renewed its claim for this long is presumed dead: the
# periodic requeue sends it again, and the next train worker resumes from its checkpoint. Its
# claim is renewed by a thread, however long a step takes.
STUDIO_TRAINING_RUN_STALE_SECONDS = env.int("STUDIO_TRAINING_RUN_STALE_SECONDS", default=120)
# The deadline of one provider call, connect to last byte (a read timeout alone let a server
# sending a byte every 4 s hold a worker for minutes); an upload's is longer.
STUDIO_TRAINING_CALL_SECONDS = env.float("STUDIO_TRAINING_CALL_SECONDS", default=60.0)
STUDIO_TRAINING_UPLOAD_SECONDS = env.float("STUDIO_TRAINING_UPLOAD_SECONDS", default=3600.0)
# Polls in a row whose answer cannot be used (4xx, nonsense) before the job fails with it.
STUDIO_TRAINING_POLL_FAILURES = env.int("STUDIO_TRAINING_POLL_FAILURES", default=5)
# How long a job reported succeeded is read again for its model id before it says none came.
STUDIO_TRAINING_MODEL_WAIT_SECONDS = env.int("STUDIO_TRAINING_MODEL_WAIT_SECONDS", default=600)

OPENAI_API_KEY = env.str("OPENAI_API_KEY", default="")
OPENAI_BASE_URL = env.str("OPENAI_BASE_URL", default="")
SYNTH_API_KEY = env.str("SYNTH_API_KEY", default="")
SYNTH_BACKEND_URL = env.str("SYNTH_BACKEND_URL", default="")

# Which environment variables an admin may name as an endpoint's key (`studio/key_names.py`,
# whole-name match); the server's own secrets (SECRET_KEY, DATABASE_URL, ...) never, whatever
# this allows.
STUDIO_KEY_ENV_PATTERN = env.str("STUDIO_KEY_ENV_PATTERN", default=r"[A-Z][A-Z0-9_]*_KEY")
try:
    re.compile(STUDIO_KEY_ENV_PATTERN)
except re.error as error:
    raise ImproperlyConfigured(f"STUDIO_KEY_ENV_PATTERN is not a regex: {error}") from None

REDIS_URL = env.str(
    "REDIS_URL",
    default=CELERY_BROKER_URL if CELERY_BROKER_URL.startswith("redis") else "",
)

# Django's cache. With Redis (the broker's server and db, keys under STUDIO_CACHE_PREFIX) it is
# shared by every web and Celery process: the evaluation statistics computed or warmed by one
# serve all, and a human game's snapshot any web worker. Without Redis (the SQLite demo), each
# process keeps its own in memory. Short timeouts: a dead Redis costs a page a miss, not a hang.
if REDIS_URL.startswith("redis"):
    from redis.backoff import ConstantBackoff
    from redis.exceptions import ConnectionError as _RedisConnectionError
    from redis.retry import Retry

    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": env.str("STUDIO_CACHE_PREFIX", default="studio"),
            "OPTIONS": {
                "socket_connect_timeout": 1,
                "socket_timeout": 5,
                # A connection taken from the pool is checked (redis-py reconnects one that
                # Redis closed); besides, one idle for 10 s is PINGed before use, and a command
                # whose connection drops is sent again once on a new one: a Redis restart costs
                # the cache its entries, never a page or a task an error
                # (tests/faults/test_limiter_redis_restart.py).
                "health_check_interval": 10,
                "retry": Retry(ConstantBackoff(0.5), 1, supported_errors=(_RedisConnectionError,)),
            },
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
# How long the batches' statistics stay cached. Their key names the episodes they are computed
# from (`evaluation.selectors._cached_statistics`), so an entry never goes stale: keep it long.
STUDIO_STATISTICS_CACHE_SECONDS = env.int("STUDIO_STATISTICS_CACHE_SECONDS", default=7 * 24 * 3600)

if not DEBUG:
    SESSION_COOKIE_HTTPONLY = True
    CSRF_COOKIE_SAMESITE = "Strict"
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "client_error_line": {"()": "studio.logging_filters.ClientErrorWithoutTraceback"},
        "drop_client_errors": {"()": "studio.logging_filters.DropClientErrors"},
        "escape_controls": {"()": "studio.logging_filters.EscapeControlCharacters"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "filters": ["escape_controls"]},
        "server": {
            "class": "logging.StreamHandler",
            "filters": ["drop_client_errors", "escape_controls"],
        },
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="WARNING")},
    "loggers": {
        # Django's default config gives "django" a console handler of its own in DEBUG, and
        # the record then reached the root's as well: every warning printed twice.
        "django": {
            "handlers": ["console"],
            "level": env.str("LOG_LEVEL", default="WARNING"),
            "propagate": False,
        },
        # Each 403 / 404 once, as one line (django.request), without a traceback.
        "django.request": {"filters": ["client_error_line"]},
        "django.server": {"handlers": ["server"], "level": "INFO", "propagate": False},
    },
}

# --- openai policy ---
# Backoff before the n-th retry of a model call: base * 2**(n-1) seconds, jittered, capped.
STUDIO_OPENAI_BACKOFF_BASE = env.float("STUDIO_OPENAI_BACKOFF_BASE", default=1.0)
STUDIO_OPENAI_BACKOFF_MAX = env.float("STUDIO_OPENAI_BACKOFF_MAX", default=30.0)
# A server's Retry-After is honoured up to this many seconds.
STUDIO_OPENAI_MAX_RETRY_AFTER = env.float("STUDIO_OPENAI_MAX_RETRY_AFTER", default=120.0)
# Connection attempts on an episode's first call before its endpoint is declared down.
STUDIO_OPENAI_CONNECT_ATTEMPTS = env.int("STUDIO_OPENAI_CONNECT_ATTEMPTS", default=3)
# Turns in a row whose call failed after all retries before the endpoint is declared down.
STUDIO_OPENAI_MAX_FAILED_TURNS = env.int("STUDIO_OPENAI_MAX_FAILED_TURNS", default=5)
# A model answer's text, reasoning and each tool call's arguments are stored up to this many
# bytes each; a longer one is cut, the cut recorded on the turn, and the turn is bad output.
STUDIO_MAX_ANSWER_BYTES = env.int("STUDIO_MAX_ANSWER_BYTES", default=64 * 1024)
# A model server's whole HTTP body (answers and errors) is read up to this many bytes.
STUDIO_MAX_RESPONSE_BYTES = env.int("STUDIO_MAX_RESPONSE_BYTES", default=4 * 1024 * 1024)

# Logins: after this many failures within STUDIO_LOGIN_LOCKOUT_SECONDS, a username (from any
# address) or an address (for any username) must wait until the oldest failure ages out.
STUDIO_LOGIN_MAX_FAILURES = env.int("STUDIO_LOGIN_MAX_FAILURES", default=5)
STUDIO_LOGIN_MAX_FAILURES_PER_ADDRESS = env.int("STUDIO_LOGIN_MAX_FAILURES_PER_ADDRESS", default=20)
STUDIO_LOGIN_LOCKOUT_SECONDS = env.int("STUDIO_LOGIN_LOCKOUT_SECONDS", default=900)
