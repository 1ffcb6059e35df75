"""Admin for inventory, collector tokens and scrape targets."""

from django.contrib import admin

from telemetry import models


@admin.register(models.Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("hostname", "rack", "u_position", "state", "nvlink_domain")
    list_filter = ("state", "rack__row__hall")
    search_fields = ("hostname",)


@admin.register(models.Gpu)
class GpuAdmin(admin.ModelAdmin):
    list_display = ("uuid", "node", "index", "model", "serial", "mig_mode")
    search_fields = ("uuid", "serial", "node__hostname")
    list_filter = ("model", "mig_mode")


@admin.register(models.CollectorToken)
class CollectorTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "created", "last_used", "revoked_at")
    readonly_fields = ("prefix", "token_hash", "created", "last_used")


@admin.register(models.AgentStatus)
class AgentStatusAdmin(admin.ModelAdmin):
    list_display = ("hostname", "collector", "reported_at")
    search_fields = ("hostname",)
    readonly_fields = ("hostname", "collector", "reported_at", "health")


# GpuEvent has a composite primary key (a hypertable), which the admin cannot show: events are
# read through /api/v1/events and the fleet pages.


@admin.register(models.Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("source", "external_id", "name", "account", "state", "gpu_count", "start_time", "end_time")
    list_filter = ("source", "state", "partition")
    search_fields = ("external_id", "name", "user", "account")


@admin.register(models.ScrapeTarget)
class ScrapeTargetAdmin(admin.ModelAdmin):
    list_display = ("url", "enabled", "hostname", "last_scrape", "last_samples", "last_error")


for model in (models.Site, models.Hall, models.Row, models.Rack, models.NvlinkDomain, models.MigInstance,
              models.Switch, models.Port, models.Link, models.PowerDevice):
    admin.site.register(model)
