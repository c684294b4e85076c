-- Argo CD health check for ManagedWorkload (opensource-server.mieweb.org/v1alpha1).
-- Install: put this script under resource.customizations.health.opensource-server.mieweb.org_ManagedWorkload
-- in the argocd-cm ConfigMap (see docs/gitops.md). Layout matches Argo CD's
-- resource_customizations/<group>/<kind>/ so it can be contributed upstream.
local hs = {}

local function condition(conditions, type)
  for _, c in ipairs(conditions or {}) do
    if c.type == type then
      return c
    end
  end
  return nil
end

local status = obj.status
if status == nil or status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to report status"
  return hs
end
if obj.metadata.generation ~= nil and status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe the latest spec"
  return hs
end

local stalled = condition(status.conditions, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = stalled.message
  return hs
end

local ready = condition(status.conditions, "Ready")
if ready ~= nil and ready.status == "True" then
  if status.phase == "Stopped" then
    -- Stopped on purpose (spec.state: Stopped): the desired state is reached, nothing runs.
    hs.status = "Suspended"
  else
    hs.status = "Healthy"
  end
  hs.message = ready.message
  return hs
end

hs.status = "Progressing"
local reconciling = condition(status.conditions, "Reconciling")
if reconciling ~= nil and reconciling.status == "True" then
  hs.message = reconciling.message
elseif ready ~= nil then
  hs.message = ready.message
else
  hs.message = "Waiting for the workload to become ready"
end
return hs
