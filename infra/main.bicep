// agent-learning on Azure: `azd up` creates everything below in one resource group.
//
//   identity      user-assigned managed identity the Function app runs as
//   monitoring    Log Analytics + Application Insights (Entra ID only)
//   storage       host storage + deployment package container (no shared keys)
//   cosmos        Cosmos DB (serverless, no keys): episodes, agent-scores, policies, runs, feedback, leases
//   servicebus    Service Bus namespace (no keys) + the scoring and training queues
//   judge         Azure OpenAI judge model (optional, no keys)
//   functionApp   Flex Consumption Function app, Python 3.11, identity-based connections only
//
// Each module grants the roles on its own resource; docs/deploying.md lists them with their scopes.
targetScope = 'subscription'

@minLength(1)
@maxLength(64)
@description('Name of the azd environment; it names the resource group and seeds every resource name.')
param environmentName string

@minLength(1)
@description('Region of every resource (it must offer Flex Consumption and, with deployJudgeModel, the judge model).')
@metadata({
  azd: {
    type: 'location'
  }
})
param location string

@description('Resource group name (default: rg-<environmentName>).')
param resourceGroupName string = ''

@description('Object id of the deploying user or pipeline; it gets the data roles local development needs (empty: none).')
param principalId string = ''

@description('Type of principalId.')
@allowed([
  'User'
  'ServicePrincipal'
  'Group'
])
param principalType string = 'User'

@description('Object id of the identity agents run as; it may read policies and write episodes (empty: assign later).')
param agentPrincipalId string = ''

@description('Agents read policies and write episodes straight to Cosmos DB (true), where one role covers every agent id; false gives agentPrincipalId no Cosmos DB role: agents use GET /api/policies and POST /api/agents/{agent_id}/episodes, which writes only the agents episodeWriters allows each caller.')
param agentDirectCosmosAccess bool = true

@description('Caller identity -> agent ids or fnmatch patterns it may write through POST /api/agents/{agent_id}/episodes (AGENT_LEARNING_EPISODE_WRITERS), e.g. {"key-0123456789abcdef": ["support-*"]}; key-<16 hex> is agent_learning.app.callers.key_identity of a function key. Empty: the route is off.')
param episodeWriters object = {}

@description('Serverless (billed per request and GB, nothing at rest beyond storage) or Provisioned (shared autoscale throughput).')
@allowed([
  'Serverless'
  'Provisioned'
])
param cosmosCapacityMode string = 'Serverless'

@description('Cosmos DB database (AGENT_LEARNING_COSMOS_DATABASE).')
param cosmosDatabaseName string = 'agent-learning'

@description('Default time to live of episodes in seconds (at most 2^31 - 1); -1 or 0 keeps them unless an episode carries its own ttl.')
@minValue(-1)
@maxValue(2147483647)
param episodeTtlSeconds int = -1

@description('Scoring queue (AGENT_LEARNING_QUEUE_NAME).')
param queueName string = 'score-episodes'

@description('Training queue (AGENT_LEARNING_TRAIN_QUEUE_NAME): the timer sends one message per agent with new scores.')
param trainQueueName string = 'train-agents'

@description('Deliveries before a message is dead-lettered (queue MaxDeliveryCount and AGENT_LEARNING_QUEUE_MAX_DELIVERIES).')
@minValue(1)
@maxValue(2000)
param queueMaxDeliveryCount int = 10

@description('Message lock in seconds (queue LockDuration and AGENT_LEARNING_QUEUE_LOCK_SECONDS).')
@minValue(5)
@maxValue(300)
param queueLockSeconds int = 60

@description('NCRONTAB schedule of the training timer (AGENT_LEARNING_TRAIN_SCHEDULE).')
param trainSchedule string = '0 */5 * * * *'

@description('Publish guardrail (AGENT_LEARNING_GUARDRAIL): enforce holds a candidate policy confidently worse than the current one, warn only logs it, off skips the evaluation.')
@allowed([
  'off'
  'warn'
  'enforce'
])
param guardrail string = 'enforce'

@description('Which episodes are judged, per agent (AGENT_LEARNING_JUDGING): comma-separated pattern=spec, spec all, a fraction (0.2) or N/min per scorer instance, e.g. \'support-*=0.2, *=all\'. Every judged episode costs three judge-model calls: the default judge deployment (judgeCapacity 36) admits about 4.8 judged episodes a minute. Episodes not judged are recorded, to judge later (agent-learn rescore --agent-id A --unjudged).')
param judging string = '*=all'

@description('Lease prefix of the change-feed trigger (AGENT_LEARNING_LEASE_PREFIX); local runs use their own.')
@minLength(1)
@maxLength(64)
param leasePrefix string = 'azure-'

@description('Create an Azure OpenAI account with a judge model deployment (not when judgeAzureEndpoint names an existing one).')
param deployJudgeModel bool = true

@description('Region of the judge model (default: location).')
param judgeLocation string = ''

@description('Model of the judge.')
param judgeModelName string = 'gpt-4o-mini'

@description('Version of the judge model.')
param judgeModelVersion string = '2024-07-18'

@description('Deployment type of the judge model.')
@allowed([
  'GlobalStandard'
  'Standard'
  'DataZoneStandard'
])
param judgeDeploymentSku string = 'GlobalStandard'

@description('Judged episodes a minute the judge deployment must admit; its capacity (thousands of tokens a minute) is judgeEpisodesPerMinute x judgeTokensPerEpisode / 1000, rounded up.')
@minValue(1)
param judgeEpisodesPerMinute int = 4

@description('Tokens Azure OpenAI admits per judged episode: the three evaluator calls\' prompt tokens plus their completion limits (python benchmarks/judge_tokens.py measures 7,481; see docs/judges-and-rewards.md#judge-tokens).')
@minValue(1)
param judgeTokensPerEpisode int = 9000

@description('Function app instances expected to score at once against the judge deployment; each paces itself to capacity x 1000 / judgeScoringInstances tokens a minute (AGENT_LEARNING_JUDGE_TOKENS_PER_MINUTE). At most 1000, as many as the app scales to, so that share is never 0, which would mean unpaced.')
@minValue(1)
@maxValue(1000)
param judgeScoringInstances int = 1

@description('Model deployment name (AGENT_LEARNING_JUDGE_DEPLOYMENT): the one created, or an existing one at judgeAzureEndpoint.')
param judgeDeploymentName string = 'judge'

@description('Endpoint of an existing Azure OpenAI resource to judge with; given, no judge model is created (grant the app identity Cognitive Services OpenAI User on it).')
param judgeAzureEndpoint string = ''

@description('Azure OpenAI API version of the judge calls (AGENT_LEARNING_JUDGE_API_VERSION).')
param judgeApiVersion string = '2024-10-21'

@description('Allow the offline rule-based judge in Azure when no judge model is configured (AGENT_LEARNING_ALLOW_OFFLINE_JUDGE).')
param allowOfflineJudge bool = false

@description('App Service Authentication is on for the Function app (turned on outside this template): its X-MS-CLIENT-PRINCIPAL-ID header then names HTTP callers (AGENT_LEARNING_TRUST_PRINCIPAL_HEADER). Off, the header is ignored and a caller is its function key.')
param appServiceAuthentication bool = false

@description('Client id of an Entra ID app registration: given, App Service Authentication is turned on for the Function app, letting anonymous requests through to the app and vouching for Entra ID tokens issued for it or for Azure AI services (what Personalizer clients ask for); the app then trusts the principal header.')
param entraClientId string = ''

@description('SHA-256 digests (hex, comma-separated) of the keys Personalizer clients may send (AGENT_LEARNING_PERSONALIZER_KEY_SHA256; `agent-learn keys new` makes a key and prints its digest). Empty: no key is accepted.')
param personalizerKeySha256 string = ''

@description('Entra ID object ids (comma-separated) that may call the Personalizer routes with a token (AGENT_LEARNING_PERSONALIZER_PRINCIPALS; needs entraClientId or appServiceAuthentication).')
param personalizerPrincipals string = ''

@description('Most instances the Function app scales out to.')
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 40

@description('Memory per Function app instance in MB.')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

@description('App settings that replace the defaults below (for example AGENT_LEARNING_W_INTENT); never put a secret here.')
param appSettingOverrides object = {}

var resourceToken = toLower(uniqueString(subscription().id, environmentName, location))
var tags = {
  'azd-env-name': environmentName
}
var functionAppName = 'func-${resourceToken}'
var deploymentContainerName = 'app-package-${take(functionAppName, 32)}-${take(resourceToken, 7)}'
// An existing endpoint, when given, is the judge: no second model is created beside it.
var deployJudge = deployJudgeModel && empty(judgeAzureEndpoint)
var judgeConfigured = deployJudgeModel || !empty(judgeAzureEndpoint)
// The judge deployment's capacity in thousands of tokens a minute, from the rate it must judge at:
// episodes a minute x tokens admitted per episode / 1000, rounded up (integer ceiling).
var judgeCapacity = ((judgeEpisodesPerMinute * judgeTokensPerEpisode) + 999) / 1000
// Each scoring instance's share of it, which the scorer paces itself below instead of meeting 429s.
var judgeTokensPerMinute = judgeConfigured ? (judgeCapacity * 1000) / judgeScoringInstances : 0

resource rg 'Microsoft.Resources/resourceGroups@2024-03-01' = {
  name: !empty(resourceGroupName) ? resourceGroupName : 'rg-${environmentName}'
  location: location
  tags: tags
}

module identity 'modules/identity.bicep' = {
  name: 'identity'
  scope: rg
  params: {
    name: 'id-func-${resourceToken}'
    location: location
    tags: tags
  }
}

module monitoring 'modules/monitoring.bicep' = {
  name: 'monitoring'
  scope: rg
  params: {
    logAnalyticsName: 'log-${resourceToken}'
    applicationInsightsName: 'appi-${resourceToken}'
    location: location
    tags: tags
    functionPrincipalId: identity.outputs.principalId
  }
}

module storage 'modules/storage.bicep' = {
  name: 'storage'
  scope: rg
  params: {
    name: 'st${resourceToken}'
    location: location
    tags: tags
    deploymentContainerName: deploymentContainerName
    functionPrincipalId: identity.outputs.principalId
  }
}

module cosmos 'modules/cosmos.bicep' = {
  name: 'cosmos'
  scope: rg
  params: {
    accountName: 'cosmos-${resourceToken}'
    databaseName: cosmosDatabaseName
    location: location
    tags: tags
    capacityMode: cosmosCapacityMode
    episodeTtlSeconds: episodeTtlSeconds
    functionPrincipalId: identity.outputs.principalId
    userPrincipalId: principalId
    agentPrincipalId: agentPrincipalId
    agentDirectCosmosAccess: agentDirectCosmosAccess
  }
}

module serviceBus 'modules/servicebus.bicep' = {
  name: 'servicebus'
  scope: rg
  params: {
    namespaceName: 'sb-${resourceToken}'
    queueName: queueName
    trainQueueName: trainQueueName
    location: location
    tags: tags
    maxDeliveryCount: queueMaxDeliveryCount
    lockSeconds: queueLockSeconds
    functionPrincipalId: identity.outputs.principalId
    userPrincipalId: principalId
    userPrincipalType: principalType
  }
}

module judge 'modules/judge.bicep' = if (deployJudge) {
  name: 'judge'
  scope: rg
  params: {
    name: 'oai-${resourceToken}'
    location: !empty(judgeLocation) ? judgeLocation : location
    tags: tags
    deploymentName: judgeDeploymentName
    modelName: judgeModelName
    modelVersion: judgeModelVersion
    deploymentSku: judgeDeploymentSku
    capacity: judgeCapacity
    functionPrincipalId: identity.outputs.principalId
    userPrincipalId: principalId
    userPrincipalType: principalType
  }
}

var judgeEndpoint = deployJudge ? judge.outputs.endpoint : judgeAzureEndpoint

// Where things are and how to reach them: identity-based connections only. The Functions host
// reads the CosmosDBConnection__* and ServiceBusConnection__* settings for its triggers, and the
// library reads the same ones, so nothing is configured twice.
var connectionSettings = {
  CosmosDBConnection__accountEndpoint: cosmos.outputs.endpoint
  CosmosDBConnection__credential: 'managedidentity'
  CosmosDBConnection__clientId: identity.outputs.clientId
  ServiceBusConnection__fullyQualifiedNamespace: serviceBus.outputs.fullyQualifiedNamespace
  ServiceBusConnection__credential: 'managedidentity'
  ServiceBusConnection__clientId: identity.outputs.clientId
  AGENT_LEARNING_STORE: 'cosmos'
  AGENT_LEARNING_COSMOS_DATABASE: cosmos.outputs.databaseName
  AGENT_LEARNING_LEASE_PREFIX: leasePrefix
  AGENT_LEARNING_QUEUE: 'servicebus'
  AGENT_LEARNING_QUEUE_NAME: serviceBus.outputs.queueName
  AGENT_LEARNING_QUEUE_MAX_DELIVERIES: string(queueMaxDeliveryCount)
  AGENT_LEARNING_QUEUE_LOCK_SECONDS: string(queueLockSeconds)
  AGENT_LEARNING_TRAIN_QUEUE_NAME: serviceBus.outputs.trainQueueName
  AGENT_LEARNING_TRAIN_SCHEDULE: trainSchedule
  AGENT_LEARNING_JUDGE: judgeConfigured ? 'evaluators' : 'offline'
  AGENT_LEARNING_ALLOW_OFFLINE_JUDGE: allowOfflineJudge ? 'true' : 'false'
  AGENT_LEARNING_JUDGE_AZURE_ENDPOINT: judgeEndpoint
  AGENT_LEARNING_JUDGE_DEPLOYMENT: judgeDeploymentName
  AGENT_LEARNING_JUDGE_API_VERSION: judgeApiVersion
  AGENT_LEARNING_JUDGE_CLIENT_ID: identity.outputs.clientId
  AGENT_LEARNING_JUDGE_BASE_URL: ''
  AGENT_LEARNING_JUDGE_MODEL: ''
  AGENT_LEARNING_JUDGE_TOKENS_PER_MINUTE: string(judgeTokensPerMinute)
  // Who may write which agent's episodes through the ingestion route.
  AGENT_LEARNING_EPISODE_WRITERS: string(episodeWriters)
  // Whether the principal header names callers: only where the platform sets it (never inferred).
  AGENT_LEARNING_TRUST_PRINCIPAL_HEADER: appServiceAuthentication || !empty(entraClientId) ? 'true' : 'false'
  // Who may call the Personalizer routes, which the host serves anonymously (their clients send
  // keys it does not read): digests of keys and principals, checked by the app.
  AGENT_LEARNING_PERSONALIZER_KEY_SHA256: personalizerKeySha256
  AGENT_LEARNING_PERSONALIZER_PRINCIPALS: personalizerPrincipals
  // Settings with a parameter of their own (and an azd variable): here, so that appSettingOverrides
  // cannot silently outrank the parameter.
  AGENT_LEARNING_JUDGING: judging
  // Resource Manager admits any case of an @allowed value; the library reads lower case only.
  AGENT_LEARNING_GUARDRAIL: toLower(guardrail)
}

// The library's defaults, stated so that a deployment shows every value it runs with and each
// one can be changed with appSettingOverrides. tests/app/test_infra.py keeps them equal to the code.
var pipelineSettings = {
  AGENT_LEARNING_PERSONALIZER_CREATE_AGENTS: 'true'
  AGENT_LEARNING_JUDGE_ATTEMPT_TIMEOUT: '60'
  AGENT_LEARNING_JUDGE_EVALUATOR_DEADLINE: '150'
  AGENT_LEARNING_JUDGE_EPISODE_DEADLINE: '180'
  AGENT_LEARNING_JUDGE_MAX_ATTEMPTS: '4'
  AGENT_LEARNING_JUDGE_RETRY_AFTER_CAP: '30'
  AGENT_LEARNING_JUDGE_MAX_TOKENS_INTENT_RESOLUTION: '200'
  AGENT_LEARNING_JUDGE_MAX_TOKENS_TASK_ADHERENCE: '400'
  AGENT_LEARNING_JUDGE_MAX_TOKENS_TASK_COMPLETION: '700'
  AGENT_LEARNING_SCORE_SETTLE_SECONDS: '60'
  AGENT_LEARNING_W_INTENT: '0.4'
  AGENT_LEARNING_W_ADHERENCE: '0.3'
  AGENT_LEARNING_W_COMPLETION: '0.3'
  AGENT_LEARNING_TOOL_FAILURE_PENALTY: '0.1'
  AGENT_LEARNING_MAX_TOOL_FAILURE_PENALTY: '0.3'
  AGENT_LEARNING_LATENCY_BUDGET_MS: '30000'
  AGENT_LEARNING_LATENCY_PENALTY: '0.1'
  AGENT_LEARNING_EMPTY_OUTPUT_PENALTY: '0.5'
  AGENT_LEARNING_COST_PER_THOUSAND_TOKENS: '0'
  AGENT_LEARNING_FEEDBACK_WEIGHT: '0.5'
  AGENT_LEARNING_LEARNING_RATE: '1.2'
  AGENT_LEARNING_DIRECTION: 'evidence'
  AGENT_LEARNING_NORMALIZE_ADVANTAGES: 'true'
  AGENT_LEARNING_MIN_REWARD_STD: '0.05'
  AGENT_LEARNING_ENTROPY_COEF: '0.001'
  AGENT_LEARNING_IMPORTANCE_CLIP: '5.0'
  AGENT_LEARNING_MAX_KL: '1.0'
  AGENT_LEARNING_EVIDENCE_PRIOR: '3.0'
  AGENT_LEARNING_REFERENCE_BATCH: '50'
  AGENT_LEARNING_MAX_LOGIT_GAP: '8.0'
  AGENT_LEARNING_GAP_PER_EVIDENCE: '4.0'
  AGENT_LEARNING_GAP_SLACK: '1.0'
  AGENT_LEARNING_CALIBRATION: '2.0'
  AGENT_LEARNING_THOMPSON_FLOOR: '2.5'
  AGENT_LEARNING_DIMENSION_THOMPSON_FLOOR: '1.5'
  AGENT_LEARNING_ODDS_CAP: '0.0'
  AGENT_LEARNING_EVIDENCE_HALF_LIFE: '3000'
  AGENT_LEARNING_CHANGE_THRESHOLD: '4.0'
  AGENT_LEARNING_RECENT_HALF_LIFE: '300'
  AGENT_LEARNING_BASELINE_PRIOR: '3.0'
  AGENT_LEARNING_SEGMENT_PRIOR: '0.0'
  AGENT_LEARNING_SEGMENT_GAP_SLACK: '0.25'
  AGENT_LEARNING_LOGIT_BOUND: '20.0'
  AGENT_LEARNING_TRAIN_MAX_BATCH: '10000'
  AGENT_LEARNING_TRAIN_MIN_BATCH: '1'
  AGENT_LEARNING_TEMPERATURE: '1.0'
  AGENT_LEARNING_EXPLORATION_FLOOR: '0.001'
  AGENT_LEARNING_POLICY_REFRESH_SECONDS: '30'
  AGENT_LEARNING_REWARD_DROP: '0.25'
  AGENT_LEARNING_COLLAPSE_ENTROPY: '0.1'
  AGENT_LEARNING_COLLAPSE_REWARD_FALL: '0.1'
  AGENT_LEARNING_DRIFT_WINDOW: '200'
  AGENT_LEARNING_DRIFT_Z: '3.0'
  AGENT_LEARNING_AUTO_PIN: 'false'
  AGENT_LEARNING_GUARDRAIL_MARGIN: '0.01'
  AGENT_LEARNING_GUARDRAIL_CONFIDENCE: '0.95'
  AGENT_LEARNING_GUARDRAIL_MIN_EFFECTIVE_SAMPLES: '30'
  AGENT_LEARNING_GUARDRAIL_SAFE_CONFIDENCE: '0.9'
  AGENT_LEARNING_GUARDRAIL_BUDGET_LATENCY_MS: '0'
  AGENT_LEARNING_GUARDRAIL_BUDGET_TOOL_FAILURE_RATE: '0'
  AGENT_LEARNING_GUARDRAIL_BUDGET_TOKENS: '0'
  AGENT_LEARNING_TELEMETRY: 'auto'
}

module functionApp 'modules/function-app.bicep' = {
  name: 'function-app'
  scope: rg
  params: {
    name: functionAppName
    planName: 'plan-${resourceToken}'
    location: location
    tags: tags
    serviceName: 'api'
    identityId: identity.outputs.id
    identityClientId: identity.outputs.clientId
    storageAccountName: storage.outputs.name
    deploymentContainerUrl: storage.outputs.deploymentContainerUrl
    applicationInsightsName: monitoring.outputs.applicationInsightsName
    appSettings: union(pipelineSettings, appSettingOverrides, connectionSettings)
    maximumInstanceCount: maximumInstanceCount
    instanceMemoryMB: instanceMemoryMB
  }
}

module appAuthentication 'modules/app-authentication.bicep' = if (!empty(entraClientId)) {
  name: 'app-authentication'
  scope: rg
  params: {
    functionAppName: functionApp.outputs.name
    clientId: entraClientId
  }
}

// azd stores these in the environment (azd env get-values): what agents and local runs need.
output AZURE_LOCATION string = location
output AZURE_TENANT_ID string = tenant().tenantId
output AZURE_RESOURCE_GROUP string = rg.name
output AZURE_FUNCTION_APP_NAME string = functionApp.outputs.name
output FUNCTION_APP_URL string = functionApp.outputs.url
output AGENT_POLICY_URL string = '${functionApp.outputs.url}/api/policies'
output AGENT_LEARNING_STORE string = 'cosmos'
output AGENT_LEARNING_COSMOS_ENDPOINT string = cosmos.outputs.endpoint
output AGENT_LEARNING_COSMOS_DATABASE string = cosmos.outputs.databaseName
output AGENT_LEARNING_QUEUE string = 'servicebus'
output AGENT_LEARNING_SERVICEBUS_NAMESPACE string = serviceBus.outputs.fullyQualifiedNamespace
output AGENT_LEARNING_QUEUE_NAME string = serviceBus.outputs.queueName
output AGENT_LEARNING_TRAIN_QUEUE_NAME string = serviceBus.outputs.trainQueueName
output AGENT_LEARNING_JUDGE string = judgeConfigured ? 'evaluators' : 'offline'
output AGENT_LEARNING_JUDGE_AZURE_ENDPOINT string = judgeEndpoint
output AGENT_LEARNING_JUDGE_DEPLOYMENT string = judgeDeploymentName
output AGENT_LEARNING_JUDGE_TOKENS_PER_MINUTE string = string(judgeTokensPerMinute)
// A host run locally shares the queues: it judges and trains as the deployed app does.
output AGENT_LEARNING_JUDGING string = judging
output AGENT_LEARNING_GUARDRAIL string = toLower(guardrail)
// ... and shapes rewards and trains with the same overrides (JSON; infra/local_settings.py applies them).
output APP_SETTING_OVERRIDES string = string(appSettingOverrides)
output JUDGE_CAPACITY int = judgeCapacity
output COSMOS_ACCOUNT_NAME string = cosmos.outputs.accountName
output COSMOS_POLICY_READER_ROLE_ID string = cosmos.outputs.policyReaderRoleName
output COSMOS_EPISODE_WRITER_ROLE_ID string = cosmos.outputs.episodeWriterRoleName
